"""Object reads through one long-lived `git cat-file --batch` per repository: the same answers as a git process of
their own, one process for a whole status run, and never a stale answer."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from conftest import KV_V1, PARSER_V1, Project, ToyUpstream, git
from helpers.gitmode import counting_git, history, series, status

from vpatch import git as vgit
from vpatch.base.paths import cache_dir
from vpatch.git import catfile
from vpatch.upstream import mirror


def cat_file_starts(log: Path) -> int:
    return sum(1 for line in log.read_text().splitlines() if line.split()[-2:] == ["cat-file", "--batch"])


@pytest.fixture(autouse=True)
def fresh_readers() -> None:
    catfile.close_all()  # each test starts as a new process would


def test_reads_match_git_show(toy_upstream: ToyUpstream) -> None:
    repo = toy_upstream.path
    (repo / "odd name.py").write_text("spaces\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a path with a space")
    head = git(repo, "rev-parse", "HEAD").strip()
    v1 = git(repo, "rev-parse", "v1.0").strip()
    paths = ["vllm/parser.py", "vllm/kv.py", "odd name.py", "vllm", "no/such/file"]
    got = vgit.read_blobs_at(repo, [v1, head], paths)
    for commit in (v1, head):
        assert got[commit]["vllm/parser.py"] == PARSER_V1.encode()
        assert got[commit]["vllm/kv.py"] == KV_V1.encode()
        assert got[commit]["vllm"] is None  # a folder is no file
        assert got[commit]["no/such/file"] is None
    assert got[v1]["odd name.py"] is None and got[head]["odd name.py"] == b"spaces\n"
    assert vgit.read_blobs_at(repo, ["0" * 40], ["vllm/kv.py"]) == {"0" * 40: {"vllm/kv.py": None}}
    times = vgit.commit_times(repo, [v1, head])
    assert times == {c: int(git(repo, "log", "-1", "--format=%ct", c)) for c in (v1, head)}


def test_a_moved_branch_is_read_as_it_is_now(toy_upstream: ToyUpstream) -> None:
    repo = toy_upstream.path
    assert vgit.read_blobs(repo, "main", ["vllm/kv.py"])["vllm/kv.py"] == KV_V1.encode()
    toy_upstream.commit({"vllm/kv.py": "moved\n"}, "move main")
    assert vgit.read_blobs(repo, "main", ["vllm/kv.py"])["vllm/kv.py"] == b"moved\n"


def test_a_repository_made_again_at_the_same_path_is_not_answered_from_the_old_one(tmp_path: Path) -> None:
    repo = tmp_path / "again"
    answers = []
    for content in ("first\n", "second\n"):
        shutil.rmtree(repo, ignore_errors=True)
        repo.mkdir()
        git(repo, "init", "-q", "-b", "main")
        (repo / "f").write_text(content)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", content)
        head = git(repo, "rev-parse", "HEAD").strip()
        answers.append(vgit.read_blobs(repo, head, ["f"])["f"])
    assert answers == [b"first\n", b"second\n"]


def cat_file_children() -> list[int]:
    """This process's `git cat-file` children, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid() and b"cat-file" in argv:
            found.append(int(entry.name))
    return found


def test_a_reader_whose_git_died_is_replaced(toy_upstream: ToyUpstream) -> None:
    repo = toy_upstream.path
    v1 = git(repo, "rev-parse", "v1.0").strip()
    assert vgit.read_blobs(repo, v1, ["vllm/kv.py"])["vllm/kv.py"] == KV_V1.encode()
    [reader] = cat_file_children()
    os.kill(reader, signal.SIGKILL)
    while Path(f"/proc/{reader}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.01)  # dead, not yet reaped
    assert vgit.read_blobs(repo, v1, ["vllm/kv.py"])["vllm/kv.py"] == KV_V1.encode()
    assert len(cat_file_children()) == 1 and cat_file_children() != [reader]


def test_a_forked_child_reads_with_a_reader_of_its_own(toy_upstream: ToyUpstream) -> None:
    repo = toy_upstream.path
    v1 = git(repo, "rev-parse", "v1.0").strip()
    assert vgit.read_blobs(repo, v1, ["vllm/kv.py"])["vllm/kv.py"] == KV_V1.encode()
    pid = os.fork()
    if pid == 0:  # the child: reads, then leaves at once (no atexit, no pytest)
        ok = vgit.read_blobs(repo, v1, ["vllm/parser.py"])["vllm/parser.py"] == PARSER_V1.encode()
        os._exit(0 if ok else 1)
    _, code = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(code) == 0
    # the parent's conversation was not disturbed by the child's
    assert vgit.read_blobs(repo, v1, ["vllm/parser.py", "vllm/kv.py"]) == {
        "vllm/parser.py": PARSER_V1.encode(), "vllm/kv.py": KV_V1.encode()}


def test_a_status_that_bisects_starts_one_cat_file(project: Project, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    series(project)
    history(project, 60)
    mirror.fetch(cache_dir(), project.upstream.url)
    calls = counting_git(tmp_path, monkeypatch)
    report = status(project)
    landed = report["patches"][0]["landed_in"]
    assert landed["bisected"] and landed["checks"] >= 4  # the touched files read at several commits
    assert cat_file_starts(calls) == 1
