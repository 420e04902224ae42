"""The overlay build keeps what git records (exec bits, symlinks), deletes exactly the named paths, and verify checks it.

A toy upstream whose vllm/ holds names with a space and with glob characters, made into a test base image
(imagebase.ensure_base); one patch adds an executable and a symlink and deletes `odd name.py` and `glob[1].py`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import Project, git, patch_of_head
from helpers.imagebase import PACKAGE_DIR, ensure_base
from typer.testing import CliRunner

from vpatch.commands.cli import app
from vpatch.docker import Docker, DockerError

pytestmark = pytest.mark.docker
REPO_ROOT = Path(__file__).resolve().parents[2]
ODD = {"vllm/odd name.py": "A = 1\n", "vllm/odd": "keep\n", "vllm/name.py": "B = 1\n",
       "vllm/glob[1].py": "C = 1\n", "vllm/glob1.py": "D = 1\n"}


@pytest.fixture(scope="module")
def docker() -> Docker:
    try:
        return Docker.connect()
    except DockerError as exc:
        if os.environ.get("CI") or shutil.which("dockerd"):
            raise
        pytest.skip(f"no docker here ({exc.message})")


def vpatch(root: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["--project", str(root), *args])
    return result.exit_code, result.output


@pytest.fixture
def odd_project(project: Project, docker: Docker, tmp_path: Path) -> tuple[Project, str]:
    up = project.upstream
    up.commit(ODD, "v2.0", tag="v2.0")
    assert vpatch(project.root, "fetch")[0] == 0
    tree = git(up.path, "rev-parse", "v2.0:vllm").strip()
    base = ensure_base(docker, "2.0", fingerprint=tree, repo="vpatch-test/reliability-base",
                       package_tar=lambda: subprocess.run(["git", "archive", "--format=tar", "v2.0", "vllm"],
                                                          cwd=up.path, check=True, capture_output=True).stdout)
    scratch = tmp_path / "scratch"
    git(tmp_path, "clone", "-q", str(up.path), str(scratch))
    git(scratch, "checkout", "-q", "--detach", "v2.0")
    (scratch / "vllm/run.sh").write_text("#!/bin/sh\necho ok\n")
    (scratch / "vllm/run.sh").chmod(0o755)
    (scratch / "vllm/latest.py").symlink_to("parser.py")
    git(scratch, "--literal-pathspecs", "rm", "-q", "vllm/odd name.py", "vllm/glob[1].py")
    git(scratch, "add", "-A")
    git(scratch, "commit", "-q", "-m", "Odd modes and names\n\nWhy.\n\nOrigin: vendor\nLast-Update: 2026-09-01")
    raw = patch_of_head(scratch)
    (project.patches / "0001-odd-modes.patch").write_text(raw)
    (project.root / "vpatch.yaml").write_text((project.root / "vpatch.yaml").read_text().replace("v1.0", "v2.0"))
    (project.root / "images").mkdir()
    (project.root / "images" / "prod.yaml").write_text(
        "image:\n  repository: vpatch-test/reliability-overlay\n  tag: prod\nstrategy: overlay\n")
    shutil.copyfile(REPO_ROOT / "Dockerfile", project.root / "Dockerfile")
    return project, base


def test_overlay_keeps_modes_and_links_deletes_exactly_and_verify_checks_modes(
        odd_project: tuple[Project, str], docker: Docker, tmp_path: Path) -> None:
    project, base = odd_project
    code, out = vpatch(project.root, "build", "prod", "--base", base)
    assert code == 0, out
    tag = next(line.split()[0] for line in out.splitlines() if line.startswith("  vpatch-test/reliability-overlay:")
               and not line.split()[0].endswith(":prod"))
    found = docker.read_entries(tag, [f"{PACKAGE_DIR}/{p}" for p in
                                      ("run.sh", "latest.py", "odd name.py", "odd", "name.py", "glob[1].py", "glob1.py")])
    entry = {Path(k).name: v for k, v in found.items()}
    assert entry["run.sh"] is not None and entry["run.sh"].mode == "100755"
    assert entry["latest.py"] is not None and (entry["latest.py"].mode, entry["latest.py"].data) == ("120000", b"parser.py")
    assert entry["odd name.py"] is None and entry["glob[1].py"] is None  # deleted, literally
    assert entry["odd"] is not None and entry["name.py"] is not None and entry["glob1.py"] is not None  # untouched
    code, out = vpatch(project.root, "verify", tag)
    assert code == 0, out

    # the same bytes without the exec bit: verify must notice
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {tag}\nRUN chmod -x {PACKAGE_DIR}/run.sh\n")
    broken = "vpatch-test/reliability-overlay:no-exec-bit"
    docker.build(context, tag=broken, buildargs={}, labels={}, dockerfile="Dockerfile", progress=None)
    try:
        code, out = vpatch(project.root, "verify", broken)
        assert code == 1, out
        assert "FAIL vllm/run.sh: a plain (non-executable) file in the image, but an executable file" in out, out
    finally:
        docker.remove_image(broken)
