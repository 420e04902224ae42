"""docs/forwarding.md is a real run: its walk on the shipped project and the real release history is executed, and
every command's exit code and every output line the page quotes must be what the tool prints (the page's rules:
tests/cli/test_doc_writing_a_patch.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import REAL_CACHE
from helpers.docwalk import steps, walk
from helpers.shipped import committed_copy, shipped_files

pytestmark = [pytest.mark.releases, pytest.mark.probe_venv]

PAGE = Path(__file__).resolve().parents[2] / "docs" / "forwarding.md"


def test_the_page_walks_forward_record_and_a_refusal() -> None:
    found = steps(PAGE.read_text())
    commands = [s.command for s in found]
    assert "vpatch forward 0003" in commands and "vpatch forward 0002" in commands
    assert any(c.startswith("vpatch forward 0003 --record ") for c in commands)
    assert any(" am -q " in c for c in commands)
    assert [s.exit_code for s in found if s.command == "vpatch forward 0002"] == [1]


def test_the_walk_is_what_the_tool_prints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          release_history: Path) -> None:
    monkeypatch.setenv("VPATCH_CACHE", str(REAL_CACHE))  # the release history and the probe venv, built once
    monkeypatch.setenv("COLUMNS", "200")
    root = committed_copy(tmp_path / "project", shipped_files())
    show = os.environ.get("VPATCH_DOC_SHOW") == "1"
    wrong = walk(PAGE.read_text(), root, show=show)
    assert not wrong, "\n\n".join(wrong)
