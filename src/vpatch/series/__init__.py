"""The patch series: the numbered format-patch files with their DEP-3 trailers, their diffs, and RETIRED.md.

Other rooms import these names from here; modules inside the room import each other directly."""

from vpatch.series.filediff import HUNK_HEADER, FileDiff, Hunk, exact_images, file_lines, hunk_name, parse_diff
from vpatch.series.files import (
    LAST_UPDATE,
    PATCH_NAME,
    PROBE,
    Forwarded,
    Patch,
    Series,
    live_check_file,
    pull_number,
    slugify,
    stray_files,
    with_forwarded,
)
from vpatch.series.retired import RETIRED_FILE, DroppedHunkRecord, NarrowedPatch, RetiredPatch, retired_entries, with_entries
from vpatch.series.trailers import TEMPLATE_BODY, missing_probe, refuse_unfinished, unfinished

__all__ = [
    "HUNK_HEADER",
    "LAST_UPDATE",
    "PATCH_NAME",
    "PROBE",
    "RETIRED_FILE",
    "TEMPLATE_BODY",
    "DroppedHunkRecord",
    "FileDiff",
    "Forwarded",
    "Hunk",
    "NarrowedPatch",
    "Patch",
    "RetiredPatch",
    "Series",
    "exact_images",
    "file_lines",
    "hunk_name",
    "live_check_file",
    "missing_probe",
    "parse_diff",
    "pull_number",
    "refuse_unfinished",
    "retired_entries",
    "slugify",
    "stray_files",
    "unfinished",
    "with_entries",
    "with_forwarded",
]
