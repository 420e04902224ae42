"""The project's own shipped series (vpatch.yaml, patches/, probes/) copied into a fresh repository, and vpatch run on it."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import git
from typer.testing import CliRunner

from vpatch.commands.cli import app

REPO_ROOT = Path(__file__).resolve().parents[2]


def vpatch(root: Path, *args: str) -> tuple[int, str]:
    """`vpatch -C ROOT ARGS` in this process: its exit code and output."""
    result = CliRunner().invoke(app, ["-C", str(root), *args])
    return result.exit_code, result.output


def committed_copy(root: Path, files: dict[str, bytes]) -> Path:
    """A project at `root` holding `files`, committed in a repository of its own."""
    root.mkdir(parents=True)
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    (root / "patches").mkdir(exist_ok=True)
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "project")
    return root


def shipped_files() -> dict[str, bytes]:
    """vpatch.yaml, patches/ and probes/ of this checkout (the test is skipped where they are not there)."""
    if not (REPO_ROOT / "vpatch.yaml").is_file() or len(list((REPO_ROOT / "patches").glob("*.patch"))) < 3:
        pytest.skip("the shipped series (vpatch.yaml, patches/, probes/: issue 3) is not in this checkout yet")
    files = {"vpatch.yaml": (REPO_ROOT / "vpatch.yaml").read_bytes()}
    for folder in ("patches", "probes"):
        for path in sorted((REPO_ROOT / folder).rglob("*")) if (REPO_ROOT / folder).is_dir() else []:
            if path.is_file() and "__pycache__" not in path.parts:
                files[str(path.relative_to(REPO_ROOT))] = path.read_bytes()
    return files
