"""Git mode: facts about upstream commits are kept by commit id, so a second status asks git no `log -p`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import PARSER_V1, Project
from helpers.gitmode import counting_git, history, series, status

from vpatch import git
from vpatch.base.paths import cache_dir
from vpatch.upstream import commitcache, mirror


def log_p_calls(log: Path) -> int:
    return sum(1 for line in log.read_text().splitlines() if " log " in f" {line} " and " -p " in f" {line} ")


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
