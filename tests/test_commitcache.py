"""Git mode: facts about upstream commits are kept by commit id, so a second status asks git no `log -p`."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import KV_V1, PARSER_V1, Project
from typer.testing import CliRunner

from vpatch import git
from vpatch.cli import app
from vpatch.upstream import cache_dir, commitcache, mirror

FIX_20 = PARSER_V1.replace("line 20\n", "line 20 fixed\n")


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


def log_p_calls(log: Path) -> int:
    return sum(1 for line in log.read_text().splitlines() if " log " in f" {line} " and " -p " in f" {line} ")


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
    result = CliRunner().invoke(app, ["--project", str(project.root), "status", "--no-probes", "--json",
                                      "--against", "main"])
    assert result.exit_code in (0, 3), result.output
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def series(project: Project) -> None:
    project.make_patch(1, "parser-fix", {"vllm/parser.py": FIX_20}, "Fix the parser",
                       trailers="Origin: vendor\nUpstream-PR: 700\nLast-Update: 2026-09-01")
    project.make_patch(2, "kv-skip-null", {"vllm/kv.py": KV_V1.replace("break", "continue")}, "Skip null blocks",
                       trailers="Origin: vendor\nUpstream-PR: 4242\nLast-Update: 2026-09-01")


def test_a_second_status_runs_no_log_p(project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    series(project)
    history(project, 80)
    calls = counting_git(tmp_path, monkeypatch)
    first = status(project)
    first_log_p = log_p_calls(calls)
    calls.write_text("")
    second = status(project)
    assert first_log_p >= 1 and log_p_calls(calls) == 0
    assert second == first
    parser = first["patches"][0]
    assert parser["results"]["main"]["state"] == "landed"
    assert parser["landed_in"]["commit"] is not None


def test_a_corrupt_cache_is_ignored_and_rebuilt(project: Project, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    series(project)
    history(project, 40)
    clean = status(project)
    shards = sorted((cache_dir() / "commit-facts").glob("*.json"))
    assert shards
    for i, shard in enumerate(shards):
        # half cut short mid-file, half well-formed JSON of the wrong shape
        shard.write_bytes(shard.read_bytes()[:37] if i % 2 else b'{"version": 1, "entries": {"x": 5}}')
    commitcache.reset()  # what a new process sees
    calls = counting_git(tmp_path, monkeypatch)
    assert status(project) == clean
    assert log_p_calls(calls) >= 1  # recomputed, not trusted
    for shard in (cache_dir() / "commit-facts").glob("*.json"):
        assert json.loads(shard.read_bytes())["version"] == 2  # written back whole


def test_only_new_commits_are_diffed_when_the_tip_moves(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    shas = history(project, 30)
    repo = mirror.fetch(cache_dir(), project.upstream.url)
    pin = git.resolve_commit(repo, "v1.0")
    assert pin is not None
    paths = ["vllm/parser.py"]
    assert commitcache.patch_id_commits(repo, pin, shas[-1], paths) == git.patch_id_commits(repo, pin, shas[-1], paths)

    newer = project.upstream.grow([(f"Later {i}", {"vllm/parser.py": PARSER_V1 + f"tail {i}\n"}) for i in range(3)])
    repo = mirror.fetch(cache_dir(), project.upstream.url)
    diffed: list[list[str]] = []
    real = git.commit_patch_ids

    def spy(repo: Path, commits: list[str], paths: list[str]) -> dict[str, str]:
        diffed.append(list(commits))
        return real(repo, commits, paths)

    monkeypatch.setattr(git, "commit_patch_ids", spy)
    commitcache.reset()
    moved = commitcache.patch_id_commits(repo, pin, newer[-1], paths)
    assert diffed == [list(reversed(newer))]  # the three new commits, newest first, and nothing seen before
    monkeypatch.setattr(git, "commit_patch_ids", real)
    assert moved == git.patch_id_commits(repo, pin, newer[-1], paths)
