"""`vpatch fetch`: git's own progress counters on stderr, and a partial mirror (--filter=blob:none) whose blobs
come from upstream when read, on which status says what it says on a full mirror. Real repositories in tmp_path;
the upstream is a local path, serving filters as GitHub does (uploadpack.allowFilter)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import PARSER_V1, Project, ToyUpstream, git, write_config
from conftest import vpatch_cli as vpatch

from vpatch import git as vgit
from vpatch.upstream import cache_dir, mirror


def toy_project(root: Path, up: ToyUpstream) -> Project:
    (root / "patches").mkdir(parents=True)
    write_config(root, up.url)
    project = Project(root, up)
    project.make_patch(1, "parser-fix", {"vllm/parser.py": PARSER_V1.replace("line 20\n", "line 20 fixed\n")},
                       "Fix the parser", trailers="Origin: vendor\nUpstream-PR: 700\nLast-Update: 2026-09-01")
    return project


def grow(up: ToyUpstream, count: int) -> None:
    def commits():  # type: ignore[no-untyped-def]
        parser = PARSER_V1
        for i in range(1, count + 1):
            files = {f"vllm/mod{i % 9}.py": f"VALUE = {i}\n" * (i % 50 + 1)}
            if i == count // 2:
                parser = parser.replace("line 20\n", "line 20 fixed\n")
                files["vllm/parser.py"] = parser
                yield "Fix the parser (#700)", files
                continue
            yield f"Upstream change {i} (#{1000 + i})", files

    up.grow(commits())
    git(up.path, "config", "uploadpack.allowFilter", "true")


def status(root: Path) -> dict:  # type: ignore[type-arg]
    code, out = vpatch(root, "status", "--json", "--no-probes", "--against", "main")
    assert code in (0, 3), out
    return json.loads(out[out.index("{"):])  # type: ignore[no-any-return]


def test_a_partial_mirror_answers_status_as_a_full_one_does(tmp_path: Path, toy_upstream: ToyUpstream) -> None:
    grow(toy_upstream, 300)
    project = toy_project(tmp_path / "project", toy_upstream)
    code, out = vpatch(project.root, "fetch", "--filter=blob:none")
    assert code == 0, out
    # git's own counters, as it draws them
    assert "receiving objects, done 100% (" in out.lower() and "mirror of" in out
    path = mirror.mirror_path(cache_dir(), toy_upstream.url)
    assert git(path, "config", "remote.origin.partialclonefilter").strip() == "blob:none"
    missing = git(path, "rev-list", "--objects", "--all", "--missing=print")
    assert sum(1 for line in missing.splitlines() if line.startswith("?")) > 100  # blobs left upstream
    partial = status(project.root)

    shutil.rmtree(path)
    shutil.rmtree(cache_dir() / "commit-facts", ignore_errors=True)
    code, out = vpatch(project.root, "fetch")
    assert code == 0, out
    assert vgit.partial_filter(path) is None  # a full mirror this time
    assert "?" not in {line[:1] for line in git(path, "rev-list", "--objects", "--all", "--missing=print").splitlines()}
    full = status(project.root)
    assert partial == full
    landed = full["patches"][0]["landed_in"]
    assert landed["commit"] and git(path, "log", "-1", "--format=%s", landed["commit"]).strip() == "Fix the parser (#700)"

    # a later fetch keeps a mirror the kind it was made
    code, out = vpatch(project.root, "fetch")
    assert code == 0, out
    assert vgit.partial_filter(path) is None


def test_an_unknown_filter_is_refused_with_the_one_that_works(tmp_path: Path, toy_upstream: ToyUpstream) -> None:
    project = toy_project(tmp_path / "project", toy_upstream)
    code, out = vpatch(project.root, "fetch", "--filter=tree:0")
    assert code != 0 and "unsupported mirror filter 'tree:0'" in out and "--filter=blob:none" in out
    assert not mirror.mirror_path(cache_dir(), toy_upstream.url).exists()
