"""Trees built without touching a work tree's index: what a person's files make, conflicted paths included."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import git

from vpatch import git as vgit


def test_worktree_tree_is_what_add_all_stages_and_leaves_the_index_as_it_was(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "a.txt").write_text("one\n")
    (repo / "gone.txt").write_text("bye\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    git(repo, "checkout", "-q", "-b", "side")
    (repo / "a.txt").write_text("side\n")
    git(repo, "commit", "-q", "-am", "side")
    git(repo, "checkout", "-q", "main")
    (repo / "a.txt").write_text("main\n")
    git(repo, "commit", "-q", "-am", "main")
    merged = subprocess.run(["git", "merge", "-q", "side"], cwd=repo, capture_output=True, check=False)
    assert merged.returncode == 1, merged  # a conflict in a.txt
    # the person's work: the conflict resolved in the file (not staged), a file deleted, one added
    (repo / "a.txt").write_text("both\n")
    (repo / "gone.txt").unlink()
    (repo / "new.txt").write_text("new\n")
    index = git(repo, "ls-files", "--stage")

    made = vgit.worktree_tree(repo)

    assert git(repo, "ls-files", "--stage") == index  # still unmerged: the person's index is theirs
    assert git(repo, "diff", "--name-only", "--diff-filter=U") == "a.txt\n"
    assert git(repo, "ls-tree", "--name-only", made).split() == ["a.txt", "new.txt"]
    assert git(repo, "show", f"{made}:a.txt") == "both\n"
    assert vgit.tree_diff(repo, "HEAD", made).count(b"diff --git ") == 3
