"""A local change to real vLLM code as a patch of a project pinned at a release of the release history: the
mail around a diff, the diff of one edit of a release's file, the project committed."""

from __future__ import annotations

from pathlib import Path

from conftest import git

from vpatch import git as vgit


def mail(subject: str, diff: bytes, trailers: str = "") -> bytes:
    return (f"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\nFrom: Test Person "
            f"<test@vpatch.invalid>\nDate: Tue, 1 Sep 2026 12:00:00 +0000\nSubject: {subject}\n\n"
            f"A local change made on v0.32.0.\n\nOrigin: vendor\nLast-Update: 2026-09-01\n{trailers}---\n").encode() + diff


def commit_project(root: Path) -> None:
    """vpatch.yaml pinned at v0.32.0 of the release history, and the project committed as it stands."""
    (root / "vpatch.yaml").write_text("upstream:\n  source: releases\n  releases: vllm\npin:\n  ref: v0.32.0\n"
                                      "patches: patches\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "project")


def diff_on(history: Path, tmp_path: Path, ref: str, path: str, change: tuple[str, str]) -> bytes:
    scratch = tmp_path / f"scratch-{path.replace('/', '-')}"
    (scratch / path).parent.mkdir(parents=True)
    git(scratch, "init", "-q")
    text = (vgit.read_blobs(history, ref, [path])[path] or b"").decode()
    assert text.count(change[0]) == 1, change[0]
    (scratch / path).write_text(text)
    git(scratch, "add", "-A")
    git(scratch, "commit", "-q", "-m", ref)
    (scratch / path).write_text(text.replace(change[0], change[1]))
    return git(scratch, "diff", "--full-index").encode()
