"""scripts/gpu-check-0001 without a GPU: its help, the bundle of the two vLLM files it carries (v0.29.0 +
0001 from the release history), its clear refusals where torch or CUDA is missing, and its CPU dry run
(its own batch and quantisation through 0001's helper; failing on a broken helper). The GPU run itself
is not tested here (no GPU): docs/live-checks.md says it has never run."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REAL_CACHE

from vpatch.probes import env as probe_env
from vpatch.probes import file as probe_file

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-check-0001"


def run(python: str, script: Path, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, str(script), *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def test_help_says_what_it_runs() -> None:
    done = run(sys.executable, SCRIPT, "--help")
    assert done.returncode == 0
    assert "--bundle DIR" in done.stdout and "--files DIR" in done.stdout and "never run" in done.stdout


@pytest.mark.releases
@pytest.mark.probe_venv
def test_the_bundle_carries_the_two_files_and_the_check_refuses_without_torch_or_cuda(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release_history: Path) -> None:
    del release_history
    monkeypatch.setenv("VPATCH_CACHE", str(REAL_CACHE))
    project = tmp_path / "project"
    project.mkdir()
    shutil.copyfile(ROOT / "vpatch.yaml", project / "vpatch.yaml")
    shutil.copytree(ROOT / "patches", project / "patches")
    bundle = tmp_path / "bundle"
    done = run(sys.executable, SCRIPT, "--bundle", str(bundle), cwd=project)
    assert done.returncode == 0, done.stderr
    qsa = (bundle / "vllm/models/qwen4_exp/nvidia/qsa.py").read_text()
    assert "def _dequantize_selected_fp8_blocks(" in qsa  # 0001 applied
    assert "def qsa_sparse_paged_attention(" in (bundle / "vllm/models/qwen4_exp/nvidia/ops/qsa.py").read_text()
    assert sorted(p.name for p in bundle.iterdir()) == ["gpu-check-0001", "vllm"]
    copied = bundle / "gpu-check-0001"
    no_torch = run(sys.executable, copied, "--files", str(bundle))
    assert no_torch.returncode == 2 and "torch is not importable" in no_torch.stderr, no_torch.stderr
    python = probe_env.probe_venv(probe_file.Probe.load(ROOT / "patches" / "probes" / "0002-mamba-null-gap-free.yaml")
                                  .environment(), cache=REAL_CACHE)
    cpu = run(str(python), copied, "--files", str(bundle))
    assert cpu.returncode == 2 and "no CUDA device" in cpu.stderr, cpu.stderr
    small = ("--cpu-dry-run", "--cache-blocks", "2048", "--context", "4096", "--rows", "4", "--kv-heads", "2",
             "--head-size", "64", "--topk", "512")
    dry = run(str(python), copied, "--files", str(bundle), *small)
    assert dry.returncode == 0 and "compact copy 128 of 2048 blocks" in dry.stdout, dry.stdout + dry.stderr
    helper = bundle / "vllm/models/qwen4_exp/nvidia/qsa.py"
    helper.write_text(qsa.replace("remapped[wanted] = compact_ids\n", "remapped[wanted] = compact_ids + 1\n"))
    broken = run(str(python), copied, "--files", str(bundle), *small)
    assert broken.returncode == 1 and "FAIL: the remapped table sends a selected token" in broken.stdout, \
        broken.stdout + broken.stderr
