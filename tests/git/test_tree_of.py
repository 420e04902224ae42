"""tree_of: the tree of a commit; kept for the process only where it is named by its full id (which cannot change)."""

from __future__ import annotations

from pathlib import Path

from conftest import git

from vpatch import git as vgit


def test_a_branch_is_asked_again_and_an_id_keeps_its_tree(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "a.txt").write_text("one\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "one")
    first = git(repo, "rev-parse", "HEAD").strip()
    first_tree = git(repo, "rev-parse", "HEAD^{tree}").strip()
    assert vgit.tree_of(repo, "main") == vgit.tree_of(repo, first) == first_tree
    assert vgit.tree_of(repo, first_tree) == first_tree

    (repo / "a.txt").write_text("two\n")
    git(repo, "commit", "-q", "-am", "two")
    second_tree = git(repo, "rev-parse", "HEAD^{tree}").strip()
    assert second_tree != first_tree
    assert vgit.tree_of(repo, "main") == second_tree  # the branch moved: not a kept answer
    assert vgit.tree_of(repo, first) == first_tree
