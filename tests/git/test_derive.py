"""A tree made from another one already extracted (`git.derive_tree`, as a probe workspace makes its second and
later trees) is the tree a fresh extraction writes: the same paths, folders, bytes, executable bits and symbolic
links, and the tree it was made from is left as it was. The real release trees: scripts/bench-derive."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from vpatch import git as vgit
from vpatch.probes import workspace
from vpatch.probes.workspace import Session

# base -> new: every kind of change a tree can make
BASE = {
    "a.txt": "a\n",
    "run.sh": "echo run\n",
    "dir/x.py": "x = 1\n",
    "dir/y.py": "y = 1\n",
    "gone/deep/only.py": "only = 1\n",
    "turns_dir": "a file that becomes a folder\n",
    "to_file/inner.py": "a folder that becomes a file\n",
}
NEW = {
    "a.txt": "a, changed\n",
    "run.sh": "echo run\n",  # only its executable bit changes
    "dir/x.py": "x = 1\n",
    "new/deep/z.py": "z = 1\n",
    "turns_dir/f.py": "now a folder\n",
    "to_file": "now a file\n",
}


def _commit(repo: Path, files: dict[str, str], links: dict[str, str], executable: set[str]) -> str:
    for entry in repo.iterdir():
        if entry.name != ".git":
            subprocess.run(["rm", "-rf", str(entry)], check=True)
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
        os.chmod(repo / path, 0o755 if path in executable else 0o644)
    for path, target in links.items():
        os.symlink(target, repo / path)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "c"],
                   cwd=repo, check=True)
    return subprocess.run(["git", "rev-parse", "HEAD^{tree}"], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


def _trees(tmp_path: Path) -> tuple[Path, str, str]:
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    base = _commit(repo, BASE, {"link": "a.txt", "dir/ln": "x.py"}, set())
    new = _commit(repo, NEW, {"link": "dir/x.py", "dir/ln": "x.py"}, {"run.sh"})
    return repo, base, new


def _snapshot(root: Path) -> dict[str, tuple[str, bytes | str, bool]]:
    """Every path under root: its kind, its bytes (a link: its target), whether it is executable."""
    found: dict[str, tuple[str, bytes | str, bool]] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                found[rel] = ("link", os.readlink(path), False)
            elif path.is_dir():
                found[rel] = ("folder", b"", False)
            else:
                found[rel] = ("file", path.read_bytes(), os.access(path, os.X_OK))
    return found


def test_a_derived_tree_is_what_a_fresh_extraction_writes(tmp_path: Path) -> None:
    repo, base, new = _trees(tmp_path)
    vgit.extract_tree(repo, base, tmp_path / "base" / "tree")
    vgit.extract_tree(repo, new, tmp_path / "fresh" / "tree")
    vgit.extract_tree(repo, base, tmp_path / "base-again" / "tree")
    changes = vgit.tree_changes(repo, base, new)
    assert sorted(changes) == sorted([
        ("M", "a.txt"), ("M", "run.sh"), ("D", "dir/y.py"), ("D", "gone/deep/only.py"), ("A", "new/deep/z.py"),
        ("M", "link"), ("D", "turns_dir"), ("A", "turns_dir/f.py"), ("D", "to_file/inner.py"), ("A", "to_file"),
    ])
    derived = tmp_path / "derived" / "tree"
    # a file a run left in the base extraction is not git's: it is not carried over
    (tmp_path / "base" / "tree" / "dir" / "left-by-a-run.txt").write_text("stray\n")
    vgit.derive_tree(repo, tmp_path / "base" / "tree", base, changes, new, derived)
    (tmp_path / "base" / "tree" / "dir" / "left-by-a-run.txt").unlink()

    fresh = _snapshot(tmp_path / "fresh" / "tree")
    assert _snapshot(derived) == fresh
    assert "gone" not in fresh and fresh["run.sh"][2] and fresh["link"] == ("link", "dir/x.py", False)
    # the tree it came from is as a fresh extraction of it
    assert _snapshot(tmp_path / "base" / "tree") == _snapshot(tmp_path / "base-again" / "tree")
    # what the two share is one file; what changed was written anew, never through a link
    base_root = tmp_path / "base" / "tree"
    assert os.stat(derived / "dir" / "x.py").st_ino == os.stat(base_root / "dir" / "x.py").st_ino
    assert os.lstat(derived / "dir" / "ln").st_ino == os.lstat(base_root / "dir" / "ln").st_ino
    for changed in ("a.txt", "run.sh"):
        assert os.stat(derived / changed).st_ino != os.stat(base_root / changed).st_ino
        assert os.stat(base_root / changed).st_nlink == 1


def test_a_workspace_makes_its_second_tree_from_its_first(tmp_path: Path) -> None:
    repo, base, new = _trees(tmp_path)
    vgit.extract_tree(repo, new, tmp_path / "fresh" / "tree")
    with Session(cache=tmp_path / "cache", zygote=False) as session:
        first = session.tree(repo, base)
        second = session.tree(repo, new)
        assert _snapshot(second) == _snapshot(tmp_path / "fresh" / "tree")
        assert os.stat(second / "dir" / "x.py").st_ino == os.stat(first / "dir" / "x.py").st_ino
        assert session.intact(base) and session.intact(new)
        # a file of the nearest tree gone (a run removed it): the next tree is extracted whole, not derived from it
        (first / "dir" / "x.py").unlink()
        shutil.rmtree(second)
        assert not session.intact(new)
        again = session.tree(repo, new)
        assert _snapshot(again) == _snapshot(tmp_path / "fresh" / "tree")
        assert os.stat(again / "dir" / "x.py").st_nlink == 1
        # a tree of another repository (no common objects) is extracted whole, not derived
        other = tmp_path / "other"
        subprocess.run(["git", "init", "-q", str(other)], check=True)
        only = _commit(other, {"solo.py": "solo = 1\n"}, {}, set())
        third = session.tree(other, only)
        assert _snapshot(third) == {"solo.py": ("file", b"solo = 1\n", False)}


def test_a_tree_asked_for_while_a_near_one_is_written_is_made_from_it(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A probe's two sides are asked for at once: the patched tree, a few files from the base being written, waits
    for it and is made from it (hard links), instead of a second whole extraction beside the first."""
    repo, base, new = _trees(tmp_path)
    vgit.extract_tree(repo, new, tmp_path / "fresh" / "tree")
    whole: list[str] = []
    real = vgit.extract_tree

    def slow_whole(repo: Path, tree: str, dest: Path) -> None:
        whole.append(tree)
        time.sleep(1.5)  # long enough for the second ask to come while it is written
        real(repo, tree, dest)

    monkeypatch.setattr(workspace.git, "extract_tree", slow_whole)
    with Session(cache=tmp_path / "cache", zygote=False) as session:
        first = threading.Thread(target=session.tree, args=(repo, base))
        first.start()
        deadline = time.monotonic() + 10
        while not whole and time.monotonic() < deadline:
            time.sleep(0.01)
        second = session.tree(repo, new)
        first.join()
        assert whole == [base]  # one whole extraction
        assert _snapshot(second) == _snapshot(tmp_path / "fresh" / "tree")
        assert os.stat(second / "dir" / "x.py").st_ino == os.stat(session.tree(repo, base) / "dir" / "x.py").st_ino
