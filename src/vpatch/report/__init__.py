"""How results are shown: tables, lines and JSON for the CLI to print. Nothing here prints.

Other rooms import these names from here; modules inside the room import each other directly."""

from vpatch.report.apply import applied_lines, moved_pin_warning
from vpatch.report.build import built_lines
from vpatch.report.console import ProgressView
from vpatch.report.export import export_lines
from vpatch.report.lock_probes import change_lines
from vpatch.report.new import started_lines
from vpatch.report.probe import checked_lines, coverage_lines, dirty_warning, regression_lines, tree_lines, written_lines
from vpatch.report.releases import release_lines
from vpatch.report.serve import container_check_line, drift_json, drift_lines, served_lines
from vpatch.report.verify import check_lines, live_lines, live_summary, matched_line

__all__ = [
    "ProgressView",
    "applied_lines",
    "built_lines",
    "change_lines",
    "check_lines",
    "checked_lines",
    "container_check_line",
    "coverage_lines",
    "dirty_warning",
    "drift_json",
    "drift_lines",
    "export_lines",
    "live_lines",
    "live_summary",
    "matched_line",
    "moved_pin_warning",
    "regression_lines",
    "release_lines",
    "served_lines",
    "started_lines",
    "tree_lines",
    "written_lines",
]
