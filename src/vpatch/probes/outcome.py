"""What a probe's answer means, wherever it runs: one interpreter for a tree and for an image.

A place to run a probe (`Place`) only says how to read files and how to run a command there; the rules are
here, once: a `files` probe's checks (a missing file is an ERROR unless `absent_is_fix`, a moved one is
checked where it went when the place can follow moves), and a command probe's exit code (0 PASS, 1 FAIL,
1 with a Python traceback, any other code or a timeout ERROR). The rules themselves are written down in
`probes`' docstring and docs/moves.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from vpatch.upstream import Fate

if TYPE_CHECKING:
    from vpatch.probes.file import Probe
    from vpatch.upstream import Move

PASS_CODE, FAIL_CODE = 0, 1
PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")
# How much of a command's output a result keeps: the tail is where probes print their verdict.
OUTPUT_CHARS = 6000
TRACEBACK = b"Traceback (most recent call last):"


class ProbeOutcome(str, Enum):
    PASS = "pass"  # the tree has the fix
    FAIL = "fail"  # the tree has the bug
    ERROR = "error"  # the probe could not decide: never read as pass or fail


class ProbeKind(str, Enum):
    FILES = "files"
    COMMAND = "command"


@dataclass(frozen=True)
class Ran:
    """What a probe's command did, wherever it ran."""

    returncode: int
    output: bytes  # stdout and stderr
    timed_out: bool = False
    failure: str = ""  # why it did not run at all (set: returncode and output mean nothing)


@dataclass(frozen=True)
class Place:
    """Where a probe runs: how to read the files it names (None: absent) and how to run its command with
    the placeholders {python}, {probe_dir} and {tree} filled in; `follow` finds where missing files moved
    (None: this place cannot know, so a missing file stays missing)."""

    name: str  # "tree", "image": "missing from the image"
    read: Callable[[Sequence[str]], Mapping[str, bytes | None]]
    run: Callable[[Probe], Ran]
    follow: Callable[[Sequence[str], Mapping[str, bytes | None]], Mapping[str, Move]] | None = None


def interpret(probe: Probe, place: Place) -> tuple[ProbeOutcome, str]:
    """The probe's outcome at `place`, and what decided it."""
    if probe.kind is ProbeKind.FILES:
        return judge_files(probe, place)
    return judge_command(probe, place.run(probe))


def argv(probe: Probe, *, python: str, probe_dir: str, tree: str) -> list[str]:
    values = {"python": python, "probe_dir": probe_dir, "tree": tree}
    return [PLACEHOLDER.sub(lambda m: values[m.group(1)], arg) for arg in probe.run]


def judge_files(probe: Probe, place: Place) -> tuple[ProbeOutcome, str]:

    blobs = place.read([check.path for check in probe.files])
    gone = [check.path for check in probe.files if blobs.get(check.path) is None]
    found = place.follow(gone, blobs) if gone and place.follow is not None else {}
    problems, notes, errors = [], [], []
    for check in probe.files:
        path, blob = check.path, blobs.get(check.path)
        move = found.get(path)
        if blob is None and move is not None and move.followed and move.new:
            notes.append(f"{path} moved to {move.new} (similarity {move.similarity}%), checked there")
            path, blob = move.new, place.read([move.new])[move.new]
        if blob is None:
            if check.absent_is_fix and (move is None or move.fate is Fate.DELETED):
                notes.append(f"{path}: absent, which the probe says is the fix")
            else:
                errors.append(f"{path}: " + (str(move) if move is not None else f"missing from the {place.name}")
                              + ("" if check.absent_is_fix else "; a missing file is no evidence either way"))
            continue
        text = blob.decode("utf-8", "surrogateescape")
        if check.absent_is_fix and not (check.contains or check.not_contains):
            problems.append(f"{path}: still there")
        problems += [f"{path}: lacks {s!r}" for s in check.contains if s not in text]
        problems += [f"{path}: still has {s!r}" for s in check.not_contains if s in text]
    tail = "".join(f"; {n}" for n in notes)
    if errors:
        return ProbeOutcome.ERROR, "; ".join(errors) + tail
    if problems:
        return ProbeOutcome.FAIL, "; ".join(problems) + tail
    return ProbeOutcome.PASS, f"all {len(probe.files)} file checks hold" + tail


def judge_command(probe: Probe, ran: Ran) -> tuple[ProbeOutcome, str]:
    output = tail(ran.output)
    if ran.failure:
        return ProbeOutcome.ERROR, ran.failure
    if ran.timed_out:
        return ProbeOutcome.ERROR, f"timed out after {probe.timeout:g}s\n" + output
    if ran.returncode == PASS_CODE:
        return ProbeOutcome.PASS, output
    # Python exits 1 on an uncaught exception too: that is a probe that broke, not a bug found.
    if ran.returncode == FAIL_CODE and TRACEBACK not in ran.output:
        return ProbeOutcome.FAIL, output
    if ran.returncode == FAIL_CODE:
        return ProbeOutcome.ERROR, f"exit code 1 with a Python traceback: the probe crashed\n{output}"
    return ProbeOutcome.ERROR, f"exit code {ran.returncode} (only 0 and 1 decide)\n{output}"


def tail(output: bytes | str) -> str:
    """The end of a command's output, the line that decided first: the last line the probe printed itself
    goes before the rest, and the log lines of what it drove (vLLM's INFO/WARNING ...) after its own."""
    text = output.decode("utf-8", "replace") if isinstance(output, bytes) else output
    text = text[-OUTPUT_CHARS:].strip()
    lines = text.splitlines()
    noise = [line for line in lines if _LOG_LINE.match(line)]
    own = [line for line in lines if not _LOG_LINE.match(line)]
    if not noise or not own:
        return text
    return "\n".join([own[-1], *own[:-1], *noise])


# vLLM's log format: "INFO 12-01 21:03:04 [file.py:12] ...", maybe behind a process prefix "(EngineCore pid=7) "
_LOG_LINE = re.compile(r"^(\([^)]*\) )?(DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d")
