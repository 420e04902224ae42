"""stacked_tree: the tree of a base with the series applied up to a patch; with `steps` (a Witness's), the stacks of
one series share their prefixes, and a changed patch is a step of its own (built again, never read)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import KV_FIXED, PARSER_FIXED, ToyUpstream, git, patch_of_head

from vpatch import git as gitdoor
from vpatch.probes import stacked_tree
from vpatch.probes.file import ProbeError
from vpatch.series.files import Patch


def patch_file(repo: Path, base: str, folder: Path, number: int, slug: str, files: dict[str, str]) -> Patch:
    """A series file made by git from `files` written on `base` (the repository is left detached at `base`)."""
    git(repo, "checkout", "-q", "--detach", base)
    for name, text in files.items():
        (repo / name).write_text(text)
    git(repo, "commit", "-q", "-am", slug)
    path = folder / f"{number:04d}-{slug}.patch"
    path.write_text(patch_of_head(repo))
    git(repo, "checkout", "-q", "--detach", base)
    return Patch.load(path)


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The trees each patch was applied on in a temporary index (git.tree_with_patch), in order."""
    calls: list[str] = []
    real = gitdoor.tree_with_patch

    def counted(repo: Path, treeish: str, patch: bytes) -> str | None:
        calls.append(treeish)
        return real(repo, treeish, patch)

    monkeypatch.setattr(gitdoor, "tree_with_patch", counted)
    return calls


def test_stacks_share_their_steps_and_a_changed_patch_is_built_again(toy_upstream: ToyUpstream, tmp_path: Path,
                                                                    built: list[str]) -> None:
    repo = toy_upstream.path
    base = git(repo, "rev-parse", "v1.0").strip()
    one = patch_file(repo, base, tmp_path, 1, "kv", {"vllm/kv.py": KV_FIXED})
    two = patch_file(repo, base, tmp_path, 2, "parser", {"vllm/parser.py": PARSER_FIXED})
    plain = stacked_tree(repo, [one, two], base, two)
    built.clear()

    steps: dict[tuple[str, str], str | None] = {}
    assert stacked_tree(repo, [one, two], base, two, steps=steps) == plain
    assert len(built) == 2
    assert stacked_tree(repo, [one, two], base, one, steps=steps) == steps[(base, one.sha256)]
    assert stacked_tree(repo, [one, two], base, two, steps=steps) == plain
    assert len(built) == 2  # both stacks read from the steps

    # the first patch changed: its step and the one after it (on another tree) are built again, with the new text
    (tmp_path / "b").mkdir()
    changed = patch_file(repo, base, tmp_path / "b", 1, "kv", {"vllm/kv.py": KV_FIXED + "# and a comment\n"})
    again = stacked_tree(repo, [changed, two], base, two, steps=steps)
    assert len(built) == 4
    assert again != plain
    assert git(repo, "show", f"{again}:vllm/kv.py") == KV_FIXED + "# and a comment\n"
    assert git(repo, "show", f"{again}:vllm/parser.py") == PARSER_FIXED


def test_a_patch_that_does_not_apply_is_named_each_time(toy_upstream: ToyUpstream, tmp_path: Path,
                                                       built: list[str]) -> None:
    repo = toy_upstream.path
    base = git(repo, "rev-parse", "v1.0").strip()
    one = patch_file(repo, base, tmp_path, 1, "kv", {"vllm/kv.py": KV_FIXED})
    # the same change again, made on the base: it does not apply on top of the first
    twice = patch_file(repo, base, tmp_path, 2, "kv-again", {"vllm/kv.py": KV_FIXED})
    steps: dict[tuple[str, str], str | None] = {}
    for _ in range(2):
        with pytest.raises(ProbeError, match=r"0002-kv-again\.patch does not apply"):
            stacked_tree(repo, [one, twice], base, twice, steps=steps)
    assert len(built) == 2  # the failing step is kept too
