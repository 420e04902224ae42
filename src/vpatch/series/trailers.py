"""Whether a patch's trailers are finished: no template text left in, and a Probe: that names a file."""

from __future__ import annotations

import re
from collections.abc import Sequence

from vpatch.base import SeriesError
from vpatch.series.files import PROBE, Patch

# A template's "fill me in" text: <...> holding no @ (a "Name <mail@host>" trailer is filled in).
_TEMPLATE_TEXT = re.compile(r"<[^<>@]*>")
# The body `vpatch new` writes, for the person to replace with the patch's own description.
TEMPLATE_BODY = "Describe the problem, the change, and how it was verified."


def unfinished(patch: Patch) -> list[tuple[str, str, str]]:
    """(the line, named: "trailer 'Bug: <...>'", what is wrong, what to do) for the template's body line left in,
    each trailer still holding template text, and a Probe: naming no file."""
    found = []
    if any(line.strip() == TEMPLATE_BODY for line in patch.body.splitlines()):
        found.append((f"body line '{TEMPLATE_BODY}'", "template text left in",
                      "replace it with what the patch does and why, and how it was verified"))
    for key, value in patch.trailers:
        line = f"trailer '{key}: {value}'"
        if _TEMPLATE_TEXT.search(value):
            found.append((line, "template text left in", "fill it in, or delete the line"))
        elif key.lower() == PROBE.lower() and not (patch.path.parent / value).is_file():
            found.append(missing_probe(patch, value))
    return found


def missing_probe(patch: Patch, value: str) -> tuple[str, str, str]:
    """(the line, what is wrong, what to do) for a Probe: trailer naming a file that does not exist: the one
    message status, export and probe check give."""
    return (f"trailer '{PROBE}: {value}'", f"names no file ({patch.path.parent / value} does not exist)",
            f"`vpatch probe new {patch.number:04d} --kind files` (or command) writes "
            f"probes/{patch.name}.yaml; or fix the path, or delete the line")


def refuse_unfinished(patches: Sequence[Patch], *, where: str = "") -> None:
    """A SeriesError naming the first unfinished trailer line of any patch (see `unfinished`)."""
    problems = [(patch, *found) for patch in patches for found in unfinished(patch)]
    if not problems:
        return
    patch, line, wrong, todo = problems[0]
    more = f" (and {len(problems) - 1} more such line(s))" if len(problems) > 1 else ""
    raise SeriesError(f"{patch.filename}: {line}: {wrong}{more}", hint=todo + (f"; {where}" if where else ""))
