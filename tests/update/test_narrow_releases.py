"""Narrowing on the real vLLM release history: a patch made of one real upstream hunk plus a local one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REAL_CACHE, git
from typer.testing import CliRunner

from vpatch import git as vgit
from vpatch.commands.cli import app
from vpatch.series.filediff import parse_diff
from vpatch.series.files import Patch

pytestmark = pytest.mark.releases
LOCAL_LINE = "# vpatch narrowing test: a local change upstream does not have\n"


def vpatch(root: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["-C", str(root), *args])
    return result.exit_code, result.output


def upstream_hunk(history: Path, before: str, after: str) -> str:
    """A small file, the same in v0.29.0 as in `before`, that upstream changes in one hunk (away from its top)
    between `before` and `after`."""
    numstat = vgit.run(history, ["diff", "--numstat", "--no-renames", before, after, "--", "vllm"]).out
    for line in sorted(numstat.splitlines(), key=lambda row: row.split("\t")[2]):
        added, removed, path = line.split("\t")
        if added == "-" or not 0 < int(added) + int(removed) < 6 or not path.endswith(".py"):
            continue
        if vgit.run(history, ["diff", "--quiet", "v0.29.0", before, "--", path], check=False).returncode != 0:
            continue
        diff = vgit.run(history, ["diff", "--no-renames", before, after, "--", path]).stdout
        files = parse_diff(diff, where=path)
        if len(files) == 1 and len(files[0].hunks) == 1 and int(files[0].hunks[0].header.split()[1].split(",")[0][1:]) > 10:
            return path
    raise AssertionError(f"no small one-hunk change between {before} and {after}")


def mixed_patch(history: Path, tmp_path: Path, path: str, after: str) -> bytes:
    """0001 on v0.29.0: upstream's hunk to `path` (which `after` has) plus one local line near the top."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    git(scratch, "init", "-q")
    target = scratch / path
    target.parent.mkdir(parents=True)
    target.write_bytes(vgit.read_blobs(history, "v0.29.0", [path])[path] or b"")
    git(scratch, "add", "-A")
    git(scratch, "commit", "-q", "-m", "v0.29.0")
    first, rest = (vgit.read_blobs(history, after, [path])[path] or b"").split(b"\n", 1)
    target.write_bytes(first + b"\n" + LOCAL_LINE.encode() + rest)
    diff = git(scratch, "diff", "--full-index", "--no-renames").encode()
    return (f"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\nFrom: Test Person "
            f"<test@vpatch.invalid>\nDate: Tue, 1 Sep 2026 12:00:00 +0000\nSubject: Change {path} two ways\n\n"
            f"One hunk is upstream's own change of {after}, the other is local.\n\n"
            f"Origin: vendor\nLast-Update: 2026-09-01\n---\n").encode() + diff


@pytest.fixture
def mixed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release_history: Path) -> tuple[Path, str]:
    monkeypatch.setenv("VPATCH_CACHE", str(REAL_CACHE))
    path = upstream_hunk(release_history, "v0.30.0", "v0.31.0")
    root = tmp_path / "project"
    (root / "patches").mkdir(parents=True)
    (root / "patches" / "0001-two-ways.patch").write_bytes(mixed_patch(release_history, tmp_path, path, "v0.31.0"))
    (root / "vpatch.yaml").write_text("upstream:\n  source: releases\n  releases: vllm\npin:\n  ref: v0.29.0\npatches: patches\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "project")
    return root, path


def test_update_narrows_a_real_upstream_hunk_away_and_status_then_says_needed(
        mixed: tuple[Path, str], release_history: Path) -> None:
    root, path = mixed
    patch_file = root / "patches" / "0001-two-ways.patch"
    assert [len(fd.hunks) for fd in Patch.load(patch_file).files] == [2]
    code, out = vpatch(root, "status", "--against", "v0.31.0", "--json")
    cell = json.loads(out)["patches"][0]["results"]["v0.31.0"]
    # status's disposition is the update's: narrowed, with the proof
    assert cell["state"] == "partial" and cell["disposition"]["action"] == "narrow" and cell["disposition"]["proof"]

    code, out = vpatch(root, "update", "--to", "v0.31.0")
    assert code == 0, out
    narrowed = Patch.load(patch_file)
    assert [len(fd.hunks) for fd in narrowed.files] == [1]
    assert LOCAL_LINE.encode() in narrowed.diff and narrowed.subject == f"Change {path} two ways"
    message = git(root, "log", "-1", "--format=%B")
    release = vgit.resolve_commit(release_history, "v0.31.0") or ""
    assert message.startswith("Update upstream pin v0.29.0 -> v0.31.0: narrow 0001\n")
    assert f"  Dropped: {path} hunk 2 (@@ " in message
    # the release history walks releases: v0.30.0 does not have the hunk, v0.31.0 is the first that does
    assert f"Applied-Upstream: v0.31.0 (first commit {release[:12]} \"vllm 0.31.0" in message
    assert "release v0.31.0" not in message  # one release, the first that has it, leads the line
    assert "Proof: on v0.31.0, the narrowed patch and the old patch" in message
    assert "## 0001-two-ways (narrowed)" in (root / "patches" / "RETIRED.md").read_text()
    print(message)

    # the applied tree holds upstream's v0.31.0 file plus the local line, as the old patch intended
    assert vpatch(root, "apply")[0] == 0
    first, rest = (vgit.read_blobs(release_history, "v0.31.0", [path])[path] or b"").split(b"\n", 1)
    assert (root / ".vpatch" / "tree" / path).read_bytes() == first + b"\n" + LOCAL_LINE.encode() + rest
    code, out = vpatch(root, "status", "--json")
    result = json.loads(out)["patches"][0]["results"]["v0.31.0"]
    assert result["state"] == "needed" and result["applies"] == "clean", result
