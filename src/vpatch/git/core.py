"""The runner every git command goes through, and the few values all parts of the git door share."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from vpatch.base import GitError, Output, run_process

Result = Output  # what a git command gave back: exit code, stdout, stderr

# Options that make vpatch's own git output independent of the user's config.
_STABLE_CONFIG = (
    "-c", "core.quotepath=true",
    "-c", "diff.noprefix=false",
    "-c", "diff.mnemonicPrefix=false",
    "-c", "diff.relative=false",
    "-c", "diff.renames=false",
    "-c", "core.abbrev=40",
    "-c", "format.signature=",
    "-c", "advice.detachedHead=false",
    "-c", "core.autocrlf=false",
    "-c", "apply.whitespace=nowarn",
)


ZERO_SHA = "0" * 40


@dataclass(frozen=True)
class Identity:
    name: str
    email: str
    date: str  # anything git accepts, e.g. "Sat, 6 Sep 2026 12:00:00 +0000"


def command(args: Sequence[str]) -> list[str]:
    """The full argv of a git command: git with the options that make its output independent of the user's config."""
    return ["git", *_STABLE_CONFIG, *args]


def run(
    cwd: Path,
    args: Sequence[str],
    *,
    input: bytes | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    timeout: float | None = None,
    die_with_parent: bool = False,
) -> Result:
    """Run one git command; on failure raise GitError naming the command, exit code and output.
    `die_with_parent`: git is killed when vpatch ends (see process.run)."""
    return run_process(command(args), cwd=cwd, input=input, env=env, check=check, timeout=timeout,
                       die_with_parent=die_with_parent, shown=["git", *args], error=GitError)


def is_object_id(name: str) -> bool:
    """Whether `name` is a full object id (which names one object forever), not a ref that can move."""
    return len(name) in (40, 64) and all(ch in "0123456789abcdef" for ch in name)
