"""Markers are truthful: a test that needs the release history, docker or the package index is left out by -m."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import FIXTURE_MARKERS

TESTS = Path(__file__).resolve().parents[1]

# A pytest plugin that prints every collected test using a fixture that needs the outside world.
_PLUGIN = f"""
NEEDS = {sorted(FIXTURE_MARKERS)!r}

def pytest_collection_finish(session):
    for item in session.items:
        used = [f for f in NEEDS if f in getattr(item, "fixturenames", ())]
        if used:
            print("NEEDS", item.nodeid, ",".join(used))
"""


def collected_needing(tmp_path: Path, *args: str) -> list[str]:
    (tmp_path / "needs_plugin.py").write_text(_PLUGIN)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "needs_plugin", "-p", "no:cacheprovider",
         *args, str(TESTS)],
        capture_output=True, text=True, check=False, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert proc.returncode in (0, 5), proc.stdout + proc.stderr  # 5: nothing collected
    return [line for line in proc.stdout.splitlines() if line.startswith("NEEDS ")]


def test_offline_selection_leaves_out_every_test_that_needs_the_outside_world(tmp_path: Path) -> None:
    everything = collected_needing(tmp_path)
    assert any("release_history" in line for line in everything)
    assert any("pip_index" in line for line in everything)
    assert collected_needing(tmp_path, "-m", "not releases and not docker and not network") == []
