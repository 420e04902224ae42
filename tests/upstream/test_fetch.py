"""`vpatch fetch`: git's own progress counters on stderr, and a partial mirror (--filter=blob:none) whose blobs
come from upstream when read, on which status says what it says on a full mirror. Real repositories in tmp_path;
the upstream is a local path, serving filters as GitHub does (uploadpack.allowFilter)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from conftest import PARSER_V1, Project, ToyUpstream, git, vpatch_json, vpatch_streams, write_config
from conftest import vpatch_cli as vpatch

from vpatch import git as vgit
from vpatch.base.paths import cache_dir
from vpatch.upstream import commitcache, mirror


def toy_project(root: Path, up: ToyUpstream) -> Project:
    (root / "patches").mkdir(parents=True)
    write_config(root, up.url)
    project = Project(root, up)
    project.make_patch(1, "parser-fix", {"vllm/parser.py": PARSER_V1.replace("line 20\n", "line 20 fixed\n")},
                       "Fix the parser", trailers="Origin: vendor\nUpstream-PR: 700\nLast-Update: 2026-09-01")
    return project


def grow(up: ToyUpstream, count: int, *, parser_every: int = 0) -> None:
    """`count` commits on main, one of them the parser fix (#700); with `parser_every`, every so many commits also
    add a line at the end of the patch's file, far from its hunk (versions a status reads)."""
    def commits():  # type: ignore[no-untyped-def]
        parser = PARSER_V1
        for i in range(1, count + 1):
            files = {f"vllm/mod{i % 9}.py": f"VALUE = {i}\n" * (i % 50 + 1)}
            if parser_every and i % parser_every == 0:
                parser += f"tail {i}\n"
                files["vllm/parser.py"] = parser
            if i == count // 2:
                parser = parser.replace("line 20\n", "line 20 fixed\n")
                files["vllm/parser.py"] = parser
                yield "Fix the parser (#700)", files
                continue
            yield f"Upstream change {i} (#{1000 + i})", files

    up.grow(commits())
    git(up.path, "config", "uploadpack.allowFilter", "true")


def status(root: Path) -> dict:  # type: ignore[type-arg]
    code, doc = vpatch_json(root, "status", "--json", "--no-probes", "--against", "main")
    assert code in (0, 3), doc
    return doc  # type: ignore[no-any-return]


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


def counting_upload_pack(mirror_path: Path, log: Path) -> None:
    """Make the mirror reach upstream through an upload-pack that writes one line per request it serves (every
    lazy fetch of a blob is one), then serves it as git's own does."""
    wrapper = log.with_suffix(".sh")
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\nexec git upload-pack "$@"\n')
    wrapper.chmod(0o755)
    git(mirror_path, "config", "remote.origin.uploadpack", str(wrapper))


def test_a_first_status_on_a_partial_mirror_fetches_what_it_reads_in_one_request(
        tmp_path: Path, toy_upstream: ToyUpstream) -> None:
    grow(toy_upstream, 300, parser_every=3)  # 100 versions of the patch's file, each read by the patch-id walk
    project = toy_project(tmp_path / "project", toy_upstream)
    code, out = vpatch(project.root, "fetch", "--filter=blob:none")
    assert code == 0, out
    path = mirror.mirror_path(cache_dir(), toy_upstream.url)
    served = tmp_path / "upload-pack.log"
    counting_upload_pack(path, served)

    code, out, err = vpatch_streams(project.root, "status", "--json", "--no-probes", "--against", "main")
    assert code in (0, 3), out + err
    # one request for every blob the status read (git alone asks once per blob or commit diff read)
    assert len(served.read_text().splitlines()) == 1, served.read_text()
    prefetched = re.search(r"prefetching (\d+) blobs: done", err)
    assert prefetched and int(prefetched.group(1)) > 100, err
    partial = json.loads(out)
    assert partial["patches"][0]["landed_in"]["commit"]

    # a second status finds them all here: it asks upstream nothing
    assert status(project.root) == partial
    assert len(served.read_text().splitlines()) == 1

    # and a first status again (empty commit cache, as a new process) with upstream gone reads only local blobs
    commitcache.reset()
    shutil.rmtree(cache_dir() / "commit-facts")
    toy_upstream.path.rename(tmp_path / "upstream-gone")
    assert status(project.root) == partial


def test_a_tree_a_probe_runs_in_comes_from_a_partial_mirror_in_one_request(
        tmp_path: Path, toy_upstream: ToyUpstream) -> None:
    grow(toy_upstream, 30)
    path = mirror.fetch(cache_dir(), toy_upstream.url, blob_filter="blob:none")
    served = tmp_path / "upload-pack.log"
    counting_upload_pack(path, served)
    files = git(path, "ls-tree", "-r", "--name-only", "main").split()
    assert len(files) == 12 and len(vgit.missing_blobs(path, ["main"], None)) == 12

    mirror.prefetch_tree(path, "main")  # what a command probe does before it extracts the tree to run in
    assert vgit.missing_blobs(path, ["main"], None) == []
    vgit.extract_tree(path, "main", tmp_path / "tree")
    assert sorted(str(f.relative_to(tmp_path / "tree")) for f in (tmp_path / "tree").rglob("*") if f.is_file()) == \
        sorted(files)
    # one request where checkout-index alone asks once per file (12 here)
    assert len(served.read_text().splitlines()) == 1


def test_an_unknown_filter_is_refused_with_the_one_that_works(tmp_path: Path, toy_upstream: ToyUpstream) -> None:
    project = toy_project(tmp_path / "project", toy_upstream)
    code, out = vpatch(project.root, "fetch", "--filter=tree:0")
    assert code != 0 and "unsupported mirror filter 'tree:0'" in out and "--filter=blob:none" in out
    assert not mirror.mirror_path(cache_dir(), toy_upstream.url).exists()
