"""Git mode at a size that shows cost: a long toy upstream history, a two-patch series, a status run, and a
`git` on PATH that logs every command vpatch starts."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import KV_FIXED, PARSER_FIXED, PARSER_V1, Project
from typer.testing import CliRunner

from vpatch.base.paths import cache_dir
from vpatch.commands.cli import app
from vpatch.upstream import mirror


def counting_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Put a `git` on PATH that logs each invocation's arguments, then runs the real git."""
    real = shutil.which("git")
    assert real is not None
    folder = tmp_path / "counting-bin"
    folder.mkdir()
    log = tmp_path / "git-calls"
    (folder / "git").write_text(f'#!/bin/sh\necho "$*" >> "{log}"\nexec {real} "$@"\n')
    (folder / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return log


def history(project: Project, count: int) -> list[str]:
    """`count` upstream commits; every 5th touches the parser away from the patch, one lands the fix."""
    def commits():  # type: ignore[no-untyped-def]
        parser = PARSER_V1
        for i in range(1, count + 1):
            files = {f"vllm/mod{i % 7}.py": f"VALUE = {i}\n"}
            if i % 5 == 0:
                parser = parser.replace(f"line {31 + i // 5 % 9}\n", f"line {31 + i // 5 % 9}.\n")
                files["vllm/parser.py"] = parser
            if i == count // 2:
                parser = parser.replace("line 20\n", "line 20 fixed\n")
                files["vllm/parser.py"] = parser
                yield "Fix the parser (#700)", files
                continue
            yield f"Upstream change {i} (#{1000 + i})", files

    shas = project.upstream.grow(commits())
    mirror.fetch(cache_dir(), project.upstream.url)
    return shas


def status(project: Project) -> dict:  # type: ignore[type-arg]
    """`vpatch status --json` against the upstream's main branch, in this process."""
    result = CliRunner().invoke(app, ["--project", str(project.root), "status", "--no-probes", "--json",
                                      "--against", "main"])
    assert result.exit_code in (0, 3), result.output
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def series(project: Project) -> None:
    """0001 the parser fix (lands in `history`), 0002 the kv fix (never lands)."""
    project.make_patch(1, "parser-fix", {"vllm/parser.py": PARSER_FIXED}, "Fix the parser",
                       trailers="Origin: vendor\nUpstream-PR: 700\nLast-Update: 2026-09-01")
    project.make_patch(2, "kv-skip-null", {"vllm/kv.py": KV_FIXED}, "Skip null blocks",
                       trailers="Origin: vendor\nUpstream-PR: 4242\nLast-Update: 2026-09-01")
