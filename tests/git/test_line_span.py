"""git.line_span_at: a range of lines at one commit, in another commit's numbering (narrowing through upstream's
rewrite names the upstream commits that changed a dropped hunk's lines with it)."""

from __future__ import annotations

from pathlib import Path

from conftest import git

from vpatch import git as vgit


def commit(repo: Path, lines: list[str], message: str) -> str:
    (repo / "f.py").write_text("".join(f"{line}\n" for line in lines))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD").strip()


def test_lines_follow_insertions_above_and_widen_to_a_rewrite(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    old = [f"line {n}" for n in range(1, 21)]
    base = commit(tmp_path, old, "base")
    # three lines inserted above, lines 10-12 rewritten as five
    new = ["top 1", "top 2", "top 3", *old[:9], "new a", "new b", "new c", "new d", "new e", *old[12:]]
    tip = commit(tmp_path, new, "rewrite (#123)")
    # untouched lines 3..5 moved down by three
    assert vgit.line_span_at(tmp_path, base, tip, "f.py", 3, 5) == (6, 8)
    # lines 9..11 overlap the rewrite (old 10-12 -> new 13-17): widened to all of it
    assert vgit.line_span_at(tmp_path, base, tip, "f.py", 9, 11) == (12, 17)
    # lines after the rewrite: shifted by 3 + 2
    assert vgit.line_span_at(tmp_path, base, tip, "f.py", 15, 16) == (20, 21)
    # context, clamped at the file's ends
    assert vgit.line_span_at(tmp_path, base, tip, "f.py", 1, 1, context=3) == (1, 7)
    assert vgit.line_span_at(tmp_path, base, tip, "f.py", 20, 20, context=3) == (22, 25)
    # what git log -L says changed them
    [rec] = vgit.line_log(tmp_path, base, tip, [("f.py", 12, 17)])
    assert rec.subject == "rewrite (#123)"
    assert vgit.line_log(tmp_path, base, tip, [("f.py", 20, 21)]) == []


def test_a_file_gone_at_the_tip_has_no_span(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    base = commit(tmp_path, ["a", "b"], "base")
    git(tmp_path, "rm", "-q", "f.py")
    git(tmp_path, "commit", "-q", "-m", "gone")
    assert vgit.line_span_at(tmp_path, base, "HEAD", "f.py", 1, 2) is None
