"""vpatch update on the real vLLM release history (v0.29.0 ... v0.33.0), in a copy of the project."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from conftest import REAL_CACHE, git
from helpers.shipped import committed_copy, shipped_files, vpatch

from vpatch import git as vgit
from vpatch.config.project import Config

pytestmark = pytest.mark.releases


def patch_names(root: Path) -> list[str]:
    return sorted(p.name[:4] for p in (root / "patches").glob("*.patch"))


def last_message(root: Path) -> str:
    return git(root, "log", "-1", "--format=%B")


# --- the shipped series: pin v0.29.0, 0001 qsa-fp8-kv, 0002 mamba-null-gap-free, 0003 qwen3 tool call ----------


@pytest.fixture
def shipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release_history: Path) -> Path:
    monkeypatch.setenv("VPATCH_CACHE", str(REAL_CACHE))
    root = committed_copy(tmp_path / "project", shipped_files())
    assert Config.load(root).pin.ref == "v0.29.0"
    assert patch_names(root) == ["0001", "0002", "0003"]
    return root


def test_stepwise_updates_drop_0002_and_0001_and_narrow_0003_on_v0_33_0(shipped: Path) -> None:
    started = time.monotonic()
    code, out = vpatch(shipped, "update", "--to", "v0.30.0")
    assert code == 0, out
    assert patch_names(shipped) == ["0001", "0003"]
    message = last_message(shipped)
    assert message.startswith("Update upstream pin v0.29.0 -> v0.30.0: drop 0002")
    assert "- 0002-" in message and "Applied-Upstream: v0.30.0" in message
    assert "Evidence: probe: " in message  # the probe decided it
    retired = (shipped / "patches" / "RETIRED.md").read_text()
    assert "## 0002-mamba-null-gap-free" in retired and "v0.30.0" in retired
    # 0001 and 0003 still apply on v0.30.0
    assert vpatch(shipped, "apply")[0] == 0

    code, out = vpatch(shipped, "update", "--to", "v0.31.0")
    assert code == 0, out
    assert patch_names(shipped) == ["0003"]
    assert "drop 0001" in last_message(shipped)

    # v0.33.0 has upstream's own transitions for 0003's cases, where 0003 adds its own (its qwen3.py hunk no
    # longer applies), but not the streamed-name strip: 0003 is narrowed through upstream's rewrite to its
    # parser_engine.py hunk, with proof (test_narrow_rewrite_releases.py holds the proof's details).
    code, out = vpatch(shipped, "update", "--to", "v0.33.0")
    assert code == 0, out
    assert patch_names(shipped) == ["0003"] and Config.load(shipped).pin.ref == "v0.33.0"
    assert "narrow 0003" in last_message(shipped)
    narrowed = next((shipped / "patches").glob("0003-*.patch")).read_text()
    assert "diff --git a/vllm/parser/qwen3.py" not in narrowed
    assert "diff --git a/vllm/parser/engine/parser_engine.py" in narrowed
    assert git(shipped, "rev-list", "--count", "HEAD").strip() == "4"
    print(f"three stepwise updates on the real history: {time.monotonic() - started:.1f}s")


def test_direct_update_drops_0001_and_0002_and_narrows_0003(shipped: Path) -> None:
    started = time.monotonic()
    code, out = vpatch(shipped, "update", "--to", "v0.33.0")
    assert code == 0, out
    assert "0001-qsa-fp8-kv.patch  [landed]" in out and "0002-mamba-null-gap-free.patch  [landed]" in out
    assert "narrow         0003-qwen3-tool-call-unclosed-function.patch  [conflict]" in out
    assert patch_names(shipped) == ["0003"] and Config.load(shipped).pin.ref == "v0.33.0"
    assert last_message(shipped).startswith("Update upstream pin v0.29.0 -> v0.33.0: drop 0001, 0002, narrow 0003")
    assert git(shipped, "rev-list", "--count", "HEAD").strip() == "2"
    print(f"direct update v0.29.0 -> v0.33.0 (0003 narrowed): {time.monotonic() - started:.1f}s")


def test_update_to_v0_32_0_refreshes_0003_and_its_probe_validates_there(shipped: Path) -> None:
    # The served image of the CPU test server is vLLM 0.32.0: 0003 must come along, refreshed.
    code, out = vpatch(shipped, "update", "--to", "v0.32.0")
    assert code == 0, out
    assert patch_names(shipped) == ["0003"]
    assert "0003-qwen3-tool-call-unclosed-function.patch  [needed]" in out
    assert ("re-validated on v0.32.0: 0003-qwen3-tool-call-unclosed-function.yaml fails without the patch and "
            "passes with it") in out
    assert vpatch(shipped, "apply")[0] == 0


# --- stand-ins on the real trees: upstream's own changes, taken back as local patches -------------------------


def standin_series(history: Path) -> dict[str, bytes]:
    """Three patches on v0.29.0, each an upstream change of one small file taken from a later release, so
    each lands verbatim in that release (0001: v0.31.0, 0002: v0.30.0, 0003: v0.33.0)."""
    lands = {1: ("v0.30.0", "v0.31.0"), 2: ("v0.29.0", "v0.30.0"), 3: ("v0.32.0", "v0.33.0")}
    files: dict[str, bytes] = {}
    for number, (before, after) in lands.items():
        path = _small_change(history, before, after)
        diff = vgit.run(history, ["diff", "--full-index", "--no-renames", before, after, "--", path]).stdout
        subject = f"Take upstream's change to {path}"
        mail = (f"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\nFrom: Test Person "
                f"<test@vpatch.invalid>\nDate: Tue, 1 Sep 2026 12:00:00 +0000\nSubject: {subject}\n\n"
                f"Stand-in for a production patch: upstream makes this change in {after}.\n\n"
                f"Origin: vendor\nLast-Update: 2026-09-01\n---\n").encode()
        files[f"patches/{number:04d}-standin-{number}.patch"] = mail + diff
    files["vpatch.yaml"] = b"upstream:\n  source: releases\n  releases: vllm\npin:\n  ref: v0.29.0\npatches: patches\n"
    return files


def _small_change(history: Path, before: str, after: str) -> str:
    """A file with a small diff between two releases that is the same in v0.29.0 as in `before`."""
    numstat = vgit.run(history, ["diff", "--numstat", "--no-renames", before, after, "--", "vllm"]).out
    for line in numstat.splitlines():
        added, removed, path = line.split("\t")
        if added == "-" or not 0 < int(added) + int(removed) < 6:
            continue
        if vgit.run(history, ["diff", "--quiet", "v0.29.0", before, "--", path], check=False).returncode == 0 and \
                vgit.resolve_commit(history, "v0.29.0") and vgit.read_blobs(history, "v0.29.0", [path])[path] is not None:
            return path
    raise AssertionError(f"no small change between {before} and {after}")


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release_history: Path) -> Path:
    monkeypatch.setenv("VPATCH_CACHE", str(REAL_CACHE))
    return committed_copy(tmp_path / "project", standin_series(release_history))


def test_standin_series_stepwise_and_direct_on_the_real_trees(standin: Path, tmp_path: Path,
                                                              release_history: Path) -> None:
    direct = tmp_path / "direct"
    shutil.copytree(standin, direct)
    timings = {}
    for ref, left in (("v0.30.0", ["0001", "0003"]), ("v0.31.0", ["0003"]), ("v0.33.0", [])):
        started = time.monotonic()
        code, out = vpatch(standin, "update", "--to", ref)
        timings[ref] = time.monotonic() - started
        assert code == 0, out
        assert patch_names(standin) == left, out
        assert f"Applied-Upstream: {ref}" in last_message(standin)
    assert "no local patch remains: the official vLLM v0.33.0 image now suffices" in out

    started = time.monotonic()
    code, out = vpatch(direct, "update", "--to", "v0.33.0")
    timings["direct"] = time.monotonic() - started
    assert code == 0, out
    assert patch_names(direct) == [] and git(direct, "rev-list", "--count", "HEAD").strip() == "2"
    assert "drop 0001, 0002, 0003" in last_message(direct)
    print("update timings on the real history:", {k: f"{v:.1f}s" for k, v in timings.items()})
