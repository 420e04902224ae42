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
import time
from pathlib import Path

import pytest
from conftest import REAL_CACHE
from helpers.docwalk import steps, walk
from helpers.shipped import committed_copy, shipped_files

pytestmark = pytest.mark.releases

PAGE = Path(__file__).resolve().parents[2] / "docs" / "writing-a-patch.md"


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
    wrong = walk(PAGE.read_text(), root, show=show)
    print(f"the walk-through of docs/writing-a-patch.md: {time.monotonic() - started:.1f}s")
    assert not wrong, "\n\n".join(wrong)
