"""A plain install, as a new user makes it: a fresh venv, `pip install .` without the test extras, then run it."""

from __future__ import annotations

import json
import subprocess
import venv
from pathlib import Path

from conftest import PARSER_V1, Project

ROOT = Path(__file__).resolve().parents[2]


def test_plain_install_runs_help_and_status(project: Project, tmp_path: Path, pip_index: dict[str, str]) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python, vpatch = env_dir / "bin" / "python", env_dir / "bin" / "vpatch"
    env = pip_index
    install = subprocess.run([str(python), "-m", "pip", "install", "--quiet", str(ROOT)], env=env,
                             capture_output=True, text=True, check=False)
    assert install.returncode == 0, install.stdout + install.stderr
    # Only what vpatch declares is there: the test extras (and anything they drag in) are not.
    listed = subprocess.run([str(python), "-m", "pip", "list", "--format=json"], env=env,
                            capture_output=True, text=True, check=True)
    installed = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert "vpatch" in installed and not {"pytest", "mypy", "ruff", "gitpython"} & installed

    help_ = subprocess.run([str(vpatch), "--help"], env=env, capture_output=True, text=True, check=False)
    assert help_.returncode == 0, help_.stderr
    assert "status" in help_.stdout

    project.make_patch(1, "parser-fix", {"vllm/parser.py": PARSER_V1.replace("line 20\n", "line 20 fixed\n")},
                       "Fix the parser")
    status = subprocess.run([str(vpatch), "--project", str(project.root), "status", "--json"], env=env,
                            capture_output=True, text=True, check=False, cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    assert [p["file"] for p in doc["patches"]] == ["0001-parser-fix.patch"]
    assert doc["patches"][0]["results"]["v1.0"]["state"] == "needed"
