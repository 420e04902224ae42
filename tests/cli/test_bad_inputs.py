"""Bad input gets a message a person can act on, never an internal error; odd leftovers are refused or warned."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import KV_V1, Project, git, snapshot
from conftest import vpatch_cli as run
from conftest import vpatch_json as run_json
from typer.testing import CliRunner

from vpatch.base.errors import ConfigError, VpatchError
from vpatch.commands.cli import app
from vpatch.config.project import Config


def committed(project: Project) -> Project:
    project.make_patch(1, "kv-skip-null", {"vllm/kv.py": KV_V1.replace("break", "continue")}, "Skip null blocks")
    git(project.root, "init", "-q", "-b", "main")
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "project")
    return project


def test_update_to_the_current_pin_says_already_there_and_changes_nothing(project: Project) -> None:
    committed(project)
    head = git(project.root, "rev-parse", "HEAD")
    before = {k: v for k, v in snapshot(project.root).items() if not k.startswith(".git/")}
    v10 = git(project.upstream.path, "rev-parse", "v1.0").strip()
    for to in ("v1.0", v10):
        code, out = run(project, "update", "--to", to)
        assert code == 0, out
        assert "already there" in out and "committed" not in out
    assert git(project.root, "rev-parse", "HEAD") == head
    assert {k: v for k, v in snapshot(project.root).items() if not k.startswith(".git/")} == before
    code, doc = run_json(project, "update", "--to", "v1.0", "--json")
    assert doc["outcome"] == "up-to-date" and doc["no_local_patch_remains"] is False


@pytest.mark.parametrize("contents", ["not json", "[]", '{"plan": 1}'])
def test_a_corrupt_stop_state_blocks_nothing_abort_clears(project: Project, contents: str) -> None:
    committed(project)
    project.upstream.commit({"vllm/other.py": "X = 1\n"}, "v1.1", tag="v1.1")
    assert run(project, "fetch")[0] == 0
    work = project.root / ".git" / "vpatch-update"
    work.mkdir()
    (work / "state.json").write_text(contents)
    for command in (["update", "--to", "v1.1"], ["update", "--continue"]):
        code, out = run(project, *command)
        assert code == 1 and "unreadable" in out and "vpatch update --abort" in out, (command, out)
    code, out = run(project, "update", "--abort")
    assert code == 0, out
    assert not work.exists()
    code, out = run(project, "update", "--to", "v1.1")
    assert code == 0, out


def test_apply_out_naming_a_file_is_refused(project: Project) -> None:
    committed(project)
    target = project.root / "a-file"
    target.write_text("keep me\n")
    code, out = run(project, "apply", "--out", str(target))
    assert code == 1 and "is not a folder" in out and "internal error" not in out, out
    assert target.read_text() == "keep me\n"


def test_stray_diff_and_orig_files_in_patches_are_warned_about(project: Project) -> None:
    committed(project)
    (project.patches / "0002-forgotten.diff").write_text("diff --git a/x b/x\n")
    (project.patches / "0001-kv-skip-null.patch.orig").write_text("old\n")
    result = CliRunner().invoke(app, ["--project", str(project.root), "status", "--no-probes"])
    assert result.exit_code in (0, 3, 4), result.output
    assert "warning: ignored in patches/" in result.output
    assert "0001-kv-skip-null.patch.orig" in result.output and "0002-forgotten.diff" in result.output


def test_a_fifo_named_like_a_patch_is_refused_not_read(project: Project) -> None:
    os.mkfifo(project.patches / "0002-pipe.patch")
    # in a child with a time limit: reading the FIFO would block for ever
    proc = subprocess.run([sys.executable, "-m", "vpatch", "--project", str(project.root), "status", "--no-probes"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "0002-pipe.patch: not a regular file" in proc.stderr, proc.stderr


@pytest.mark.parametrize("name", ["../../x", "a/b", ".."])
def test_upstream_releases_must_be_a_project_name(tmp_path: Path, name: str) -> None:
    (tmp_path / "vpatch.yaml").write_text(f"upstream:\n  source: releases\n  releases: '{name}'\npin:\n  ref: v0.29.0\n")
    with pytest.raises(ConfigError, match=r"upstream\.releases"):
        Config.load(tmp_path)


def test_duplicate_yaml_keys_are_refused(tmp_path: Path) -> None:
    (tmp_path / "vpatch.yaml").write_text("pin:\n  ref: v1.0\n  ref: v2.0\n")
    with pytest.raises(ConfigError, match="appears twice"):
        Config.load(tmp_path)


def test_duplicate_keys_in_a_probe_and_an_image_definition(tmp_path: Path) -> None:
    from vpatch.config.definition import ImageDefinition
    from vpatch.probes.file import Probe

    probe = tmp_path / "p.yaml"
    probe.write_text("kind: files\nkind: command\nrun: [x]\n")
    with pytest.raises(VpatchError, match="appears twice"):
        Probe.load(probe)
    with pytest.raises(ConfigError, match="appears twice"):
        ImageDefinition.parse("image: a/b\nimage: c/d\n", name="prod", path=tmp_path / "prod.yaml", source="prod.yaml")


def test_a_nul_byte_in_a_probe_command_is_refused(tmp_path: Path) -> None:
    from vpatch.probes.file import Probe

    probe = tmp_path / "p.yaml"
    probe.write_text('kind: command\nrun: ["{python}", "-c", "print(1)\\0"]\n')
    with pytest.raises(VpatchError, match="NUL byte"):
        Probe.load(probe)


@pytest.mark.parametrize("image", ["my image:v1", "vllm/VLLM-openai:v1", "vllm/vllm-openai:", "UPPER"])
def test_bad_base_image_names_are_refused(tmp_path: Path, image: str) -> None:
    from vpatch.config.definition import ImageDefinition

    with pytest.raises(ConfigError, match=r"base\.image"):
        ImageDefinition.parse(f"image:\n  repository: ml/prod\n  tag: prod\nbase:\n  image: '{image}'\n", name="prod",
                              path=tmp_path / "prod.yaml", source="prod.yaml")
