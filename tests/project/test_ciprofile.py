"""The run's profile (tests/helpers/ciprofile.py): seconds per module summed over every phase, kept for scripts/ci-profile."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
SCRIPT = TESTS.parent / "scripts" / "ci-profile"


def test_seconds_per_module_and_the_server_start_line_are_printed_and_kept(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(
        "from helpers import ciprofile\n\ndef pytest_configure(config):\n    ciprofile.register(config)\n")
    (tmp_path / "test_slow.py").write_text(
        "import time, pytest\n\n@pytest.fixture(scope='module')\ndef server():\n    time.sleep(0.6)\n\n"
        "def test_a(server):\n    time.sleep(0.3)\n\ndef test_b(server):\n    pass\n")
    (tmp_path / "test_fast.py").write_text("def test_c():\n    pass\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, env={"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "time per test module" in done.stdout and "real vLLM server starts: " in done.stdout, done.stdout
    data = json.loads((tmp_path / ".pytest_cache" / "v" / "vpatch" / "ci-profile").read_text())
    rows = {row["module"]: row for row in data["modules"]}
    assert list(rows) == ["test_slow.py", "test_fast.py"]  # slowest first
    assert rows["test_slow.py"]["tests"] == 2 and rows["test_fast.py"]["tests"] == 1
    assert rows["test_slow.py"]["seconds"] >= 0.9  # the module fixture's setup counts with its module
    # the script reads the profile where pytest's cache keeps it
    shown = subprocess.run([sys.executable, str(SCRIPT), "--cache", str(tmp_path / ".pytest_cache")],
                           capture_output=True, text=True)
    assert shown.returncode == 0 and "test_slow.py" in shown.stdout and "2 tests" in shown.stdout, shown.stdout + shown.stderr
