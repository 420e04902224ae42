"""The series on disk: parsing, metadata, and a clear error for every malformed file."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import KV_V1, Project, snapshot
from conftest import vpatch_cli as cli
from typer.testing import CliRunner

from vpatch.base.errors import SeriesError
from vpatch.commands.cli import app
from vpatch.series.files import Series

GOOD = """From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: vpatch operators <operators@vpatch.invalid>
Date: Sun, 14 Sep 2026 12:00:00 +0000
Subject: Skip null blocks when freeing a range

The Mamba table has null gaps.

Origin: vendor
Bug: https://github.com/vllm-project/vllm/issues/1
Upstream-PR: 55450
Probe: probes/0002.yaml
Last-Update: 2026-09-14

diff --git a/vllm/kv.py b/vllm/kv.py
index 1111111111111111111111111111111111111111..2222222222222222222222222222222222222222 100644
--- a/vllm/kv.py
+++ b/vllm/kv.py
@@ -2,4 +2,4 @@ def free(blocks):
     for b in reversed(blocks):
         if b is None:
-            break
+            continue
         release(b)
"""


def test_parses_headers_trailers_and_diff(tmp_path: Path) -> None:
    (tmp_path / "0002-mamba-null-gap-free.patch").write_text(GOOD)
    (tmp_path / "0010-later.patch").write_text(GOOD)
    (tmp_path / "RETIRED.md").write_text("not a patch\n")
    series = Series.load(tmp_path)
    assert [p.number for p in series] == [2, 10]
    patch = series.patches[0]
    assert patch.subject == "Skip null blocks when freeing a range"
    assert patch.author == "vpatch operators <operators@vpatch.invalid>"
    assert patch.upstream_pr == 55450
    assert patch.trailer("Origin") == "vendor"
    assert patch.probe_path == tmp_path / "probes/0002.yaml"
    assert patch.paths == ("vllm/kv.py",)
    assert [h.header for h in patch.files[0].hunks] == ["@@ -2,4 +2,4 @@ def free(blocks):"]
    assert series.next_number() == 11
    assert series.get("2") is patch and series.get("0002-mamba-null-gap-free") is patch


BAD = [
    ("0001-no-diff.patch", GOOD.split("diff --git")[0], "has no diff"),
    ("0001-bad-hunk.patch", GOOD.replace("@@ -2,4 +2,4 @@", "@@ -2,x +2,4 @@"), "broken hunk header in vllm/kv.py"),
    ("0001-short-hunk.patch", GOOD.replace("@@ -2,4 +2,4 @@", "@@ -2,9 +2,9 @@"), "is cut short"),
    ("0001-escape.patch", GOOD.replace("a/vllm/kv.py", "a/../etc/passwd").replace("b/vllm/kv.py", "b/../etc/passwd"), "outside the tree"),
    ("0001-absolute.patch", GOOD.replace("--- a/vllm/kv.py", "--- /etc/passwd")
     .replace("diff --git a/vllm/kv.py b/vllm/kv.py", "diff --git /etc/passwd /etc/passwd")
     .replace("+++ b/vllm/kv.py", "+++ /etc/passwd"), "absolute path"),
    ("0001-gitdir.patch", GOOD.replace("vllm/kv.py", ".git/hooks/pre-commit"), "inside the .git folder"),
    ("1-badname.patch", GOOD, "not a series file name"),
]


@pytest.mark.parametrize(("name", "text", "message"), BAD, ids=[b[0] for b in BAD])
def test_malformed_patch_is_refused_by_name(project: Project, name: str, text: str, message: str) -> None:
    (project.patches / name).write_text(text)
    before = snapshot(project.root)
    result = CliRunner().invoke(app, ["--project", str(project.root), "apply"])
    assert result.exit_code == 1
    assert name in result.output and message in result.output
    assert "hint:" in result.output
    assert snapshot(project.root) == before
    assert not (project.root / ".vpatch").exists()


def test_two_files_with_one_number(project: Project) -> None:
    (project.patches / "0003-one.patch").write_text(GOOD)
    (project.patches / "0003-two.patch").write_text(GOOD)
    before = snapshot(project.root)
    result = CliRunner().invoke(app, ["--project", str(project.root), "apply"])
    assert result.exit_code == 1
    assert "two patches share number 0003: 0003-one.patch and 0003-two.patch" in result.output
    assert snapshot(project.root) == before


def test_missing_patches_folder(tmp_path: Path) -> None:
    with pytest.raises(SeriesError, match="does not exist"):
        Series.load(tmp_path / "nope")


def test_pin_that_does_not_resolve(project: Project) -> None:
    (project.root / "vpatch.yaml").write_text((project.root / "vpatch.yaml").read_text().replace("v1.0", "v9.9"))
    before = snapshot(project.root)
    code, out = cli(project, "apply")
    assert code == 1 and "unknown ref 'v9.9'" in out and "hint:" in out
    assert snapshot(project.root) == before


def test_unknown_ref(project: Project) -> None:
    code, out = cli(project, "apply", "--ref", "no-such-branch")
    assert code == 1 and "unknown ref 'no-such-branch'" in out
    assert not (project.root / ".vpatch").exists()


def test_export_without_tree(project: Project) -> None:
    code, out = cli(project, "export")
    assert code == 1 and "no applied tree to export from" in out and "vpatch apply first" in out


def test_export_with_dirty_tree_changes_nothing(project: Project) -> None:
    project.make_patch(1, "kv", {"vllm/kv.py": KV_V1.replace("break", "continue")}, "Skip null blocks")
    assert cli(project, "apply")[0] == 0
    (project.root / ".vpatch/tree/vllm/kv.py").write_text("half-edited\n")
    before = snapshot(project.root)
    code, out = cli(project, "export")
    assert code == 1 and "has uncommitted changes: vllm/kv.py" in out
    assert snapshot(project.root) == before


def test_export_with_deleted_tree(project: Project) -> None:
    import shutil

    project.make_patch(1, "kv", {"vllm/kv.py": KV_V1.replace("break", "continue")}, "Skip null blocks")
    assert cli(project, "apply")[0] == 0
    shutil.rmtree(project.root / ".vpatch/tree")
    before = snapshot(project.root)
    code, out = cli(project, "export")
    assert code == 1 and "is missing" in out
    assert snapshot(project.root) == before


def test_invalid_config_through_cli_has_no_traceback(project: Project) -> None:
    (project.root / "vpatch.yaml").write_text("pin:\n  ref: v1.0\nbogus: 1\n")
    code, out = cli(project, "apply")
    assert code == 1
    assert "key 'bogus' is not a known key" in out
    assert "Traceback" not in out


def test_export_crash_leaves_old_files_intact(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from conftest import git

    project.make_patch(1, "kv", {"vllm/kv.py": KV_V1.replace("break", "continue")}, "Skip null blocks")
    assert cli(project, "apply")[0] == 0
    tree = project.root / ".vpatch/tree"
    (tree / "vllm/kv.py").write_text(KV_V1.replace("break", "pass"))
    git(tree, "commit", "-q", "-a", "--amend", "--no-edit")
    before = snapshot(project.root)

    def crash(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    code, _ = cli(project, "export")
    assert code != 0
    assert snapshot(project.root) == before
    assert not [p for p in project.patches.iterdir() if p.name.endswith(".tmp")]


def test_git_signature_after_the_diff_is_not_part_of_it(tmp_path: Path) -> None:
    (tmp_path / "0001-signed.patch").write_text(GOOD + "-- \n2.39.5\n\n")
    patch = Series.load(tmp_path).patches[0]
    assert [f.path for f in patch.files] == ["vllm/kv.py"]
    assert len(patch.files[0].hunks) == 1


def test_encoded_subject_is_decoded_and_a_broken_one_kept(tmp_path: Path) -> None:
    encoded = GOOD.replace("Subject: Skip null blocks when freeing a range", "Subject: =?UTF-8?q?Fix=20na=C3=AFve=20parser?=")
    broken = GOOD.replace("Subject: Skip null blocks when freeing a range", "Subject: =?no-such-charset?q?x?=")
    (tmp_path / "0001-encoded.patch").write_text(encoded)
    (tmp_path / "0002-broken.patch").write_text(broken)
    first, second = Series.load(tmp_path).patches
    assert first.subject == "Fix naïve parser"
    assert second.subject == "=?no-such-charset?q?x?="
