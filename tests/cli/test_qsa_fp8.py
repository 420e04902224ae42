"""0001's FP8 dequantisation on the real v0.29.0 and v0.30.0 trees with the patch applied, on the CPU.

tests/helpers/qsa_fp8_check.py runs in the probe venv over the patched trees, two altered copies of the
v0.29.0 one and the unpatched v0.29.0 tree, in one process (importing torch is most of its time). It
loads the patched helper from each tree's source (the module itself does not import in the probe
venv; the check's docstring says why and how) and checks it against a full dequantisation. The QSA
Triton kernel needs CUDA and is not run here; nothing in this module tests it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import REAL_CACHE

from vpatch import git
from vpatch.probes import env as probe_env
from vpatch.probes import file as probe_file
from vpatch.series.files import Series

# One worker runs the module: its fixture runs the check on every tree once.
pytestmark = [pytest.mark.releases, pytest.mark.probe_venv, pytest.mark.xdist_group("qsa-fp8")]

ROOT = Path(__file__).resolve().parents[2]
CHECK = Path(__file__).resolve().parents[1] / "helpers" / "qsa_fp8_check.py"
QSA = "vllm/models/qwen4_exp/nvidia/qsa.py"
FILES = [QSA, "vllm/models/qwen4_exp/nvidia/ops/qsa.py"]  # all the check reads of a tree
# The behavioural probes' venv (from their lock) already has CPU torch: sharing it builds nothing new.
VENV_PROBE = ROOT / "patches" / "probes" / "0002-mamba-null-gap-free.yaml"
MUTANTS = {
    # The block remap off by one: each selected entry points at the next compact block.
    "remap-off-by-one": ("remapped[wanted] = compact_ids\n", "remapped[wanted] = compact_ids + 1\n"),
    # Correct values, but every block the table names is copied: the memory claim breaks.
    "copy-every-block": ("wanted = wanted[:spare]\n", "wanted = torch.ones_like(wanted[:spare])\n"),
}


def materialise(history: Path, tag: str, dest: Path, *, patched: bool = True) -> Path:
    """The files the check reads, from `tag` of the release history with 0001 applied (or not)."""
    tree = tag
    if patched:
        patch = next(p for p in Series.load(ROOT / "patches") if p.name == "0001-qsa-fp8-kv")
        applied = git.tree_with_patch(history, tag, patch.raw)
        assert applied is not None, f"0001 does not apply to {tag}"
        tree = applied
    for path, blob in git.read_blobs(history, tree, FILES).items():
        assert blob is not None, f"{tag} has no {path}"
        (dest / path).parent.mkdir(parents=True, exist_ok=True)
        (dest / path).write_bytes(blob)
    return dest


def mutate(tree: Path, old: str, new: str) -> Path:
    source = (tree / QSA).read_text()
    assert source.count(old) == 1, f"the patched helper no longer has {old.strip()!r}: update the mutant"
    (tree / QSA).write_text(source.replace(old, new))
    return tree


@pytest.fixture(scope="module")
def reports(release_history: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The check's report for each tree, by name: v0.29.0, v0.30.0, the mutants, and unpatched."""
    base = tmp_path_factory.mktemp("qsa-trees")
    trees = {tag: materialise(release_history, tag, base / tag) for tag in ("v0.29.0", "v0.30.0")}
    for name, (old, new) in MUTANTS.items():
        trees[name] = mutate(materialise(release_history, "v0.29.0", base / name), old, new)
    trees["unpatched"] = materialise(release_history, "v0.29.0", base / "unpatched", patched=False)
    python = probe_env.probe_venv(probe_file.Probe.load(VENV_PROBE).environment(), cache=REAL_CACHE)
    proc = subprocess.run([str(python), str(CHECK), *map(str, trees.values())], capture_output=True, text=True,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}, timeout=600, check=False)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == len(trees), f"the check crashed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr[-3000:]}"
    by_tree = {str(path): name for name, path in trees.items()}
    return {by_tree[line["tree"]]: line for line in lines}


@pytest.mark.parametrize(("tag", "layout"), [("v0.29.0", "plain"), ("v0.30.0", "packed")])
def test_every_entry_the_kernel_reads_gets_the_fully_dequantised_kv(
        reports: dict[str, dict[str, Any]], tag: str, layout: str) -> None:
    report = reports[tag]
    assert (report["exit"], report.get("failures")) == (0, []), report
    assert report["helper"].startswith(f"{QSA}:") and report["layout"] == layout
    # Read entries were compared, and every kind of masked entry occurred and stayed masked.
    assert report["entries_read"] > 1000 and report["entries_read_past_sequence"] > 0
    assert all(n > 0 for n in report["masked"].values()), report["masked"]
    # The memory claim, on a 4,096-block cache: the copy holds what the selection reaches (on v0.30.0
    # plus at most one block per row for the count column), a small part of a full BF16 copy.
    real = report["realistic"]
    assert real["blocks_held"] == real["blocks_selected"] + real["blocks_held_for_count_column"]
    assert real["compact_bytes"] < real["full_bf16_copy_bytes"] // 4
    assert (real["blocks_held_for_count_column"] > 0) == (layout == "packed")


@pytest.mark.parametrize(("mutant", "kind"), [("remap-off-by-one", "values"), ("copy-every-block", "memory")])
def test_the_check_fails_on_a_broken_helper(reports: dict[str, dict[str, Any]], mutant: str, kind: str) -> None:
    report = reports[mutant]
    assert report["exit"] == 1, report
    assert {failure.split(":", 1)[0] for failure in report["failures"]} == {kind}, report["failures"]


def test_the_check_is_an_error_on_a_tree_without_the_patch(reports: dict[str, dict[str, Any]]) -> None:
    report = reports["unpatched"]
    assert report["exit"] == 2 and "is 0001 applied" in report["error"], report
