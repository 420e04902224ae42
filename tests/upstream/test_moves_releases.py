"""Upstream moves on the real vLLM release history: vllm/entrypoints/offline_utils.py, which v0.32.0 moved to
vllm/entrypoints/common/offline.py (git's rename detection pairs them), carrying three patches made on v0.29.0.

(a) 0001 a local change in a function the move left alone: needed at v0.32.0 and v0.33.0 at the new path,
    kept re-targeted by `update --to v0.32.0`.
(b) 0002 upstream's own v0.32.0 change to that file, carried as a backport: landed at v0.32.0 and dropped.
(c) 0003 a local change whose `files` probe has only `not_contains` on the old path: the probe follows the move
    and fails there, so the patch is never landed and never dropped (it used to read as landed and be dropped).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REAL_CACHE, git
from typer.testing import CliRunner

from vpatch import git as vgit
from vpatch.commands.cli import app
from vpatch.image.base import expected_files
from vpatch.probes import file as probe_file
from vpatch.probes import runner as probes
from vpatch.series.files import Patch, Series

pytestmark = pytest.mark.releases
OLD = "vllm/entrypoints/offline_utils.py"
NEW = "vllm/entrypoints/common/offline.py"
LORA_BEFORE = 'f"and lora_request ({len(lora_request)}) must be the same."'
LORA_AFTER = 'f"and lora_request ({len(lora_request)}) must have the same length."'
PARAMS_BEFORE = 'f"and params ({len(params)}) must be the same."'
PARAMS_AFTER = 'f"and params ({len(params)}) must have the same length."'
PROBE = f"kind: files\nfiles:\n  {OLD}:\n    not_contains: ['{PARAMS_BEFORE}']\n"


def vpatch(root: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["-C", str(root), *args])
    return result.exit_code, result.output


def function(text: str, name: str) -> str:
    """The source of method `name` (from its `def` to the next one) in a file's text."""
    start = text.index(f"    def {name}(")
    end = text.index("\n    def ", start + 1)
    return text[start:end]


def mail(subject: str, diff: bytes, *, trailers: str = "") -> bytes:
    return (f"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\nFrom: Test Person "
            f"<test@vpatch.invalid>\nDate: Tue, 1 Sep 2026 12:00:00 +0000\nSubject: {subject}\n\n"
            f"A change to {OLD} made on v0.29.0.\n\nOrigin: vendor\nLast-Update: 2026-09-01\n{trailers}---\n"
            ).encode() + diff


def patch_on_pin(history: Path, tmp_path: Path, name: str, change: tuple[str, str], path: str = OLD) -> bytes:
    """The diff on v0.29.0's `path` that replaces change[0] by change[1] (each present once)."""
    scratch = tmp_path / f"scratch-{name}"
    (scratch / path).parent.mkdir(parents=True)
    git(scratch, "init", "-q")
    text = (vgit.read_blobs(history, "v0.29.0", [path])[path] or b"").decode()
    assert text.count(change[0]) == 1, change[0]
    (scratch / path).write_text(text)
    git(scratch, "add", "-A")
    git(scratch, "commit", "-q", "-m", "v0.29.0")
    (scratch / path).write_text(text.replace(change[0], change[1]))
    return git(scratch, "diff", "--full-index").encode()


def release_text(history: Path, ref: str, path: str) -> str:
    return (vgit.read_blobs(history, ref, [path])[path] or b"").decode()


@pytest.fixture
def moved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release_history: Path) -> Path:
    monkeypatch.setenv("VPATCH_CACHE", str(REAL_CACHE))
    # the move is real: git's own rename detection (default similarity) pairs the two paths
    renames = vgit.run(release_history, ["diff", "-M", "--name-status", "v0.31.0", "v0.32.0"]).out
    assert any(line.startswith("R") and line.split("\t")[1:] == [OLD, NEW] for line in renames.splitlines())
    old29, new32 = release_text(release_history, "v0.29.0", OLD), release_text(release_history, "v0.32.0", NEW)
    # (a) and (c) change functions the move left alone; (b) is upstream's v0.32.0 version of one it changed
    for ref in ("v0.32.0", "v0.33.0"):
        new = release_text(release_history, ref, NEW)
        assert LORA_BEFORE in new and PARAMS_BEFORE in new
        assert function(new, "_lora_request_to_seq") == function(old29, "_lora_request_to_seq")
    priority = (function(old29, "_priority_to_seq"), function(new32, "_priority_to_seq"))
    assert priority[0] != priority[1] and priority[1] in release_text(release_history, "v0.33.0", NEW)
    root = tmp_path / "project"
    (root / "patches" / "probes").mkdir(parents=True)
    (root / "patches" / "0001-lora-length-message.patch").write_bytes(
        mail("Say which length differs for lora_request", patch_on_pin(release_history, tmp_path, "a",
                                                                         (LORA_BEFORE, LORA_AFTER))))
    (root / "patches" / "0002-scalar-priority.patch").write_bytes(
        mail("Backport: accept a scalar priority", patch_on_pin(release_history, tmp_path, "b", priority)))
    (root / "patches" / "probes" / "0003-params.yaml").write_text(PROBE)
    (root / "patches" / "0003-params-length-message.patch").write_bytes(
        mail("Say which length differs for params", patch_on_pin(release_history, tmp_path, "c",
                                                                  (PARAMS_BEFORE, PARAMS_AFTER)),
             trailers="Probe: probes/0003-params.yaml\n"))
    (root / "vpatch.yaml").write_text("upstream:\n  source: releases\n  releases: vllm\npin:\n  ref: v0.29.0\n"
                                      "patches: patches\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "project")
    return root


def cells(root: Path, *refs: str) -> dict[str, dict[str, dict[str, object]]]:
    args = [a for ref in refs for a in ("--against", ref)]
    result = CliRunner().invoke(app, ["-C", str(root), "status", *args, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)  # progress (rename detection) goes to stderr
    return {p["file"][:4]: p["results"] for p in data["patches"]}


def moved_evidence(cell: dict[str, object]) -> list[str]:
    evidence = cell["evidence"]
    assert isinstance(evidence, list)
    return [e["detail"] for e in evidence if e["kind"] == "moved"]


def test_status_follows_the_real_move_needed_landed_and_a_probe_that_follows_it(moved: Path) -> None:
    result = cells(moved, "v0.31.0", "v0.32.0", "v0.33.0")
    for ref in ("v0.32.0", "v0.33.0"):
        a, c = result["0001"][ref], result["0003"][ref]
        assert a["state"] == "needed" and a["applies"] in ("clean", "offsets"), a
        assert c["state"] == "needed", c
        for cell in (a, c):
            (move,) = moved_evidence(cell)
            assert move.startswith(f"{OLD} -> {NEW} (similarity ") and "release v0.32.0" in move, move
            assert f"moved to {NEW}" in str(cell["summary"]), cell["summary"]
        # (c): the probe followed the move and found the bug in the moved file
        probe = next(e for e in c["evidence"] if e["kind"] == "probe")
        assert probe["says"] == "not-landed" and f"{OLD} moved to {NEW}" in probe["detail"], probe
    # (b): upstream's own change, released with the move, reverse-applies at the new path
    assert result["0002"]["v0.32.0"]["state"] == "landed", result["0002"]["v0.32.0"]
    assert any(e["kind"] == "reverse-apply" and e["says"] == "landed" for e in result["0002"]["v0.32.0"]["evidence"])
    # before the move nothing moved: no evidence of it, and the old path is judged as it is
    assert result["0001"]["v0.31.0"]["state"] == "needed" and not moved_evidence(result["0001"]["v0.31.0"])


def test_a_files_probe_never_reads_the_moved_file_as_fixed(moved: Path, release_history: Path) -> None:
    probe = probe_file.Probe.load(moved / "patches" / "probes" / "0003-params.yaml")
    pin = vgit.resolve_commit(release_history, "v0.29.0")
    followed = probes.run_probe(release_history, probe, "v0.32.0", moves_from=pin)
    assert followed.outcome is probes.ProbeOutcome.FAIL, followed
    assert f"{OLD} moved to {NEW}" in followed.detail and "still has" in followed.detail
    # without a place to follow from, the missing file is an error, never a pass
    alone = probes.run_probe(release_history, probe, "v0.32.0")
    assert alone.outcome is probes.ProbeOutcome.ERROR and "no evidence" in alone.detail, alone


def test_update_keeps_the_needed_patches_retargeted_and_drops_the_backport(moved: Path, release_history: Path) -> None:
    code, out = vpatch(moved, "update", "--to", "v0.32.0")
    assert code == 0, out
    names = sorted(p.name for p in (moved / "patches").glob("*.patch"))
    assert names == ["0001-lora-length-message.patch", "0003-params-length-message.patch"], out
    for name, after in (("0001-lora-length-message.patch", LORA_AFTER), ("0003-params-length-message.patch", PARAMS_AFTER)):
        patch = Patch.load(moved / "patches" / name)
        assert patch.paths == (NEW,), patch.paths
        assert f"diff --git a/{NEW} b/{NEW}".encode() in patch.diff and OLD.encode() not in patch.diff
        assert after.encode() in patch.diff
    message = git(moved, "log", "-1", "--format=%B")
    print(message)
    assert "drop 0002" in message.splitlines()[0]
    assert f"moved {OLD} -> {NEW}" in message and "git am -3" in message
    # the probe now names the new path too
    assert (moved / "patches" / "probes" / "0003-params.yaml").read_text() == PROBE.replace(OLD, NEW)
    assert "Files probes re-targeted to the moved paths (their keys rewritten):\n- patches/probes/0003-params.yaml" in message

    result = cells(moved, "v0.33.0")
    for number in ("0001", "0003"):
        for ref in ("v0.32.0", "v0.33.0"):
            cell = result[number][ref]
            assert cell["state"] == "needed" and cell["applies"] == "clean", cell
            assert not moved_evidence(cell)  # at its new pin the patch names the file where it is
    assert vpatch(moved, "apply")[0] == 0
    applied = (moved / ".vpatch" / "tree" / NEW).read_text()
    assert LORA_AFTER in applied and PARAMS_AFTER in applied
    # what an overlay image ships and `vpatch verify` expects: the moved file, patched, under its new name
    series = Series.load(moved / "patches")
    pre, post = expected_files(release_history, vgit.resolve_commit(release_history, "v0.32.0") or "",
                               series.patches, [NEW, OLD])
    assert pre[OLD] is None and post[OLD] is None
    assert LORA_AFTER.encode() in (post[NEW] or b"") and PARAMS_AFTER.encode() in (post[NEW] or b"")


CHAT = "vllm/entrypoints/chat_utils.py"
CHAT_MOVED = "vllm/renderers/chat_utils.py"
ITEMS = "vllm/renderers/chat_utils/item_tracker.py"
CHAT_LINE = ('f"modality_order ({len(vision_chunks_modality_order)}) must have same length"',
             'f"modality_order ({len(vision_chunks_modality_order)}) must have the same length"')


def test_a_real_file_moved_then_split_into_a_package_is_followed_then_its_hunk_follows_the_code(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release_history: Path) -> None:
    """chat_utils.py moved to vllm/renderers/ in v0.32.0 (git: R091 from v0.29.0), and v0.33.0 cut that file into
    a package of modules, none of which git pairs with it at 50 %: the file is followed at v0.32.0; at v0.33.0 the
    file is not guessed, but the hunk's code is found whole in one module (hunkmoves.py) and judged there."""
    monkeypatch.setenv("VPATCH_CACHE", str(REAL_CACHE))
    late = vgit.run(release_history, ["diff", "-M", "--name-status", "v0.32.0", "v0.33.0", "--"]).out.splitlines()
    assert f"D\t{CHAT_MOVED}" in late and "A\tvllm/renderers/chat_utils/chat_message.py" in late
    root = tmp_path / "project"
    (root / "patches").mkdir(parents=True)
    (root / "patches" / "0001-chat-template-message.patch").write_bytes(mail(
        "Say the same length", patch_on_pin(release_history, tmp_path, "chat", CHAT_LINE, path=CHAT)))
    (root / "vpatch.yaml").write_text("upstream:\n  source: releases\n  releases: vllm\npin:\n  ref: v0.29.0\n"
                                      "patches: patches\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "project")
    result = cells(root, "v0.32.0", "v0.33.0")["0001"]
    at32, at33 = result["v0.32.0"], result["v0.33.0"]
    assert at32["state"] == "needed" and moved_evidence(at32)[0].startswith(f"{CHAT} -> {CHAT_MOVED} (similarity ")
    assert at33["state"] == "needed" and at33["applies"] == "clean", at33
    assert at33["summary"] == f"applies cleanly; {CHAT} #1 moved to {ITEMS}", at33["summary"]
    lost, found = moved_evidence(at33)
    assert lost.startswith(f"{CHAT} moved to {CHAT_MOVED} in ") and "(release v0.32.0), and since then no file" in lost
    assert lost.endswith("each of its hunks followed its code to one clear place (below)"), lost
    assert found.startswith(f"{CHAT} hunk 1 (@@ -699,7 +699,7 @@) -> {ITEMS} line 351 (score 100%"), found
    assert "(release v0.33.0)" in found
    _code, out = vpatch(root, "update", "--to", "v0.33.0", "--dry-run")
    assert "would re-apply 0001-chat-template-message.patch  [needed]" in out, out
    assert f"moved: {CHAT} hunk 1 (@@ -699,7 +699,7 @@) -> {ITEMS} line 351" in out
    assert "each of its hunks followed its code" in out and "a person must" not in out, out
