"""Work trees of one shared repository (the release history every test and every vpatch process uses): adds,
removals and prunes from several processes at once, under load, never take one another's work tree away."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FIXTURE_GROUPS, git

from vpatch import git as vgit

# On the real-server tests' worker, between them: beside a deploy's timed checks, the busy loops below would make
# the load they are kept from (two servers never load at once, and no test loads the cores beside one).
pytestmark = pytest.mark.xdist_group(FIXTURE_GROUPS["vllm_server_image"])

# One vpatch process's work on the shared repository, as apply and update do it (their `.partial` tree, update's
# am-proof): add a work tree at PATH, read it, remove it (which prunes), until the deadline; prints
# "adds N" and one "FAIL ..." line per failure.
_WORKER = """
import sys, time
import shutil
from pathlib import Path
from vpatch import git
from vpatch.base import GitError

repo, dest, commit, until = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], float(sys.argv[4])
adds = 0
while time.time() < until:
    try:
        git.add_worktree(repo, dest, commit)
        assert (dest / "d0" / "f0").read_text() == "0 0\\n", "the work tree was not checked out"
        adds += 1
    except (GitError, AssertionError, OSError) as exc:
        print("FAIL", str(exc).replace("\\n", " | ")[:400], flush=True)
    git.remove_worktree(repo, dest)
    shutil.rmtree(dest, ignore_errors=True)  # as apply and update do after a removal
print("adds", adds, flush=True)
"""
_BUSY = "import time\nend = time.time() + float(__import__('sys').argv[1])\nwhile time.time() < end:\n    pass\n"


def test_adds_and_removes_from_several_processes_under_load_never_break_one_another(tmp_path: Path) -> None:
    """The cold CI run at load 5-7 lost an update's am-proof tree: `git worktree add` failed with "fatal: Could not
    write new index file." Another process's `git worktree prune` (every removal prunes) had deleted the new
    registration: git makes worktrees/<id>/ first and marks it `locked` (initializing) only after, and a prune that
    looks in between finds no gitdir file and deletes the folder, under the check-out that is writing its index.
    Here four processes do what apply and update do, at once, beside two busy loops (load ~6 on two cores)."""
    source = tmp_path / "source"
    source.mkdir()
    git(source, "init", "-q", "-b", "main")
    # a tree big enough that a check-out takes a while under load, small enough for many rounds
    for d in range(10):
        (source / f"d{d}").mkdir()
        for f in range(20):
            (source / f"d{d}" / f"f{f}").write_text(f"{d} {f}\n")
    git(source, "add", "-A")
    git(source, "commit", "-q", "-m", "tree")
    repo = tmp_path / "shared.git"
    git(tmp_path, "clone", "-q", "--bare", str(source), str(repo))
    commit = git(repo, "rev-parse", "main").strip()
    seconds = 12.0
    until = time.time() + seconds
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    busy = [subprocess.Popen([sys.executable, "-c", _BUSY, str(seconds)]) for _ in range(2)]
    # every process's tree has the same name in its own folder, as every test's `.tree.partial` does: git
    # numbers the registrations tree, tree1, tree2, ... and a removed one's number is taken again
    workers = [subprocess.Popen([sys.executable, "-c", _WORKER, str(repo), str(tmp_path / f"p{i}" / "tree"), commit,
                                 str(until)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for i in range(4)]
    outputs = [w.communicate(timeout=seconds + 300)[0] for w in workers]
    for b in busy:
        b.wait(timeout=60)
    lines = [line for out in outputs for line in out.splitlines()]
    failures = [line for line in lines if line.startswith("FAIL")]
    adds = sum(int(line.split()[1]) for line in lines if line.startswith("adds "))
    assert all(w.returncode == 0 for w in workers), outputs
    assert not failures, f"{len(failures)} failed of {adds + len(failures)} adds:\n" + "\n".join(failures[:10])
    assert adds >= 8, outputs  # enough rounds to have met the others' prunes
    assert vgit.run(repo, ["worktree", "list", "--porcelain"]).out.count("worktree ") == 1  # nothing left registered
