"""A docs page that is a real run: its indented blocks' commands, their exit codes, input and quoted output
(docs/writing-a-patch.md and docs/forwarding.md; the rules are in tests/cli/test_doc_writing_a_patch.py)."""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from helpers.shipped import vpatch

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


def walk(page: str, root: Path, *, show: bool = False) -> list[str]:
    """Run the page's steps in `root`, in order: what went other than the page says, one entry per step (empty: the
    page is what the tool prints). A step whose exit code differs ends the walk: the steps after it depend on it.
    `show`: print each step's output as it runs (VPATCH_DOC_SHOW=1 in the tests)."""
    wrong = []
    for step in steps(page):
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
                break
    return wrong
