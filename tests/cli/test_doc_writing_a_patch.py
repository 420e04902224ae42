"""docs/writing-a-patch.md is a real run: its walk-through is executed on the shipped project and the real
release history, and every command's exit code and every output line the page quotes must be what the tool
prints. CI fails when the page and the tool disagree.

The page's rules: in an indented block, `$ CMD` is run in the project folder (`vpatch ...` in this process,
anything else by bash), `# exit N` after it is its exit code (0 when not said), a heredoc (`<<'EOF'` ...
`EOF`) is its input, and the lines after it are output lines that must appear in that order in what it
printed (`...` stands for lines left out). `$PROJECT` is the project folder; a probe's time (`in 0.0s`,
or `(from the cache)`) is not compared, nor the id of a commit the reader makes. Set VPATCH_DOC_SHOW=1 to
print each command's real output (to write the page from a run).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import REAL_CACHE
from helpers.shipped import committed_copy, shipped_files, vpatch

pytestmark = pytest.mark.releases

PAGE = Path(__file__).resolve().parents[2] / "docs" / "writing-a-patch.md"
_EXIT = re.compile(r"\s+#\s*exit (\d+)\b.*$")
_COMMENT = re.compile(r"\s{2,}#.*$")
_TIME = re.compile(r" (in \d+\.\d+s|\(from the cache\))$", re.M)  # a probe's time, or its cached result
_COMMIT = re.compile(r"\bcommit [0-9a-f]{12}\b")


@dataclass
class Step:
    line: int  # where the command is on the page
    command: str
    exit_code: int
    stdin: str | None = None
    expected: list[str] = field(default_factory=list)


def steps(page: str) -> list[Step]:
    """The commands of the page's indented blocks, in order, with their exit codes, input and quoted output."""
    found: list[Step] = []
    current: Step | None = None  # the command whose output the next indented lines are
    heredoc: list[str] | None = None
    for number, raw in enumerate(page.splitlines(), 1):
        if heredoc is not None and not raw.strip():
            heredoc.append(raw[5:])  # a blank line of the input (a diff's blank context line is one space)
            continue
        if not raw.startswith("    "):
            if raw.strip() and heredoc is None:
                current = None  # a paragraph ends the block
            continue
        line = raw[4:]
        if heredoc is not None and current is not None:
            if line == "EOF":
                current.stdin = "".join(f"{x}\n" for x in heredoc)
                heredoc = None
            else:
                heredoc.append(line)
        elif line.startswith("$ "):
            m = _EXIT.search(line)
            command = _COMMENT.sub("", _EXIT.sub("", line[2:])).rstrip()
            current = Step(number, command.removesuffix("<<'EOF'").rstrip(), int(m[1]) if m else 0)
            found.append(current)
            heredoc = [] if command.endswith("<<'EOF'") else None
        elif current is not None and line.strip():
            current.expected.append(line.rstrip())
    return found


def run_step(root: Path, step: Step) -> tuple[int, str]:
    if step.command.startswith("vpatch "):
        args = shlex.split(step.command)[1:]
        assert step.stdin is None, step
        return vpatch(root, *args)
    done = subprocess.run(["bash", "-c", step.command], cwd=root, input=step.stdin, text=True, capture_output=True)
    return done.returncode, done.stdout + done.stderr


def normal(text: str, root: Path) -> str:
    """Output and page alike: the project folder as $PROJECT, no times, and no id of a commit the reader makes
    (`vpatch new`'s: its date is the reader's)."""
    text = text.replace(str(root.resolve()), "$PROJECT").replace(str(root), "$PROJECT")
    return _COMMIT.sub("commit <id>", _TIME.sub(" in N.Ns", text))


def missing_lines(expected: list[str], output: list[str]) -> list[str]:
    """The quoted lines not found in `output` in their order ("..." skips any lines)."""
    at, missing = 0, []
    for want in (w for w in expected if w.strip() != "..."):
        hit = next((i for i in range(at, len(output)) if output[i].rstrip() == want), None)
        if hit is None:
            missing.append(want)
        else:
            at = hit + 1
    return missing


def test_the_page_parses_into_the_walk_through() -> None:
    found = steps(PAGE.read_text())
    commands = [s.command.split(" ")[:2] for s in found]
    assert ["vpatch", "apply"] in commands and ["vpatch", "export"] in commands and ["vpatch", "new"] in commands
    assert any(s.command.startswith("git -C .vpatch/tree apply") and s.stdin and "diff --git" in s.stdin for s in found)
    assert any(s.exit_code for s in found)  # the mistakes are on the page with their exit codes


def test_the_walk_through_is_what_the_tool_prints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  release_history: Path) -> None:
    monkeypatch.setenv("VPATCH_CACHE", str(REAL_CACHE))  # the release history and the probe venv, built once
    monkeypatch.setenv("COLUMNS", "200")
    root = committed_copy(tmp_path / "project", shipped_files())
    show = os.environ.get("VPATCH_DOC_SHOW") == "1"
    started = time.monotonic()
    wrong = []
    for step in steps(PAGE.read_text()):
        t0 = time.monotonic()
        code, out = run_step(root, step)
        out = normal(out, root)
        if show:
            print(f"\n=== line {step.line}: $ {step.command}  (exit {code}, {time.monotonic() - t0:.1f}s)\n{out}")
        missing = missing_lines([normal(line, root) for line in step.expected], out.splitlines())
        if code != step.exit_code or missing:
            wrong.append(f"line {step.line}: $ {step.command}: exit {code} (the page says {step.exit_code})"
                         + "".join(f"\n  not printed: {m}" for m in missing) + f"\n--- it printed:\n{out}")
            if code != step.exit_code:
                break  # the steps after it depend on it
    print(f"the walk-through of docs/writing-a-patch.md: {time.monotonic() - started:.1f}s")
    assert not wrong, "\n\n".join(wrong)
