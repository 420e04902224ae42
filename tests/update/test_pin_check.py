"""A recorded pin.commit that upstream lost, or that its tag no longer names, is explained with the fix."""

from __future__ import annotations

import pytest
from conftest import KV_V1, Project, git
from conftest import vpatch_cli as run


def pin(project: Project, commit: str) -> None:
    config = project.root / "vpatch.yaml"
    config.write_text(config.read_text().replace("  ref: v1.0\n", f"  ref: v1.0\n  commit: {commit}\n"))
    git(project.root, "init", "-q", "-b", "main")
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "project")


@pytest.fixture
def pinned(project: Project) -> Project:
    project.make_patch(1, "kv-skip-null", {"vllm/kv.py": KV_V1.replace("break", "continue")}, "Skip null blocks")
    project.upstream.commit({"vllm/other.py": "X = 1\n"}, "v1.1", tag="v1.1")
    assert run(project, "fetch")[0] == 0
    return project


@pytest.mark.parametrize("command", [["status"], ["apply"], ["update", "--to", "v1.1"], ["build", "tiny", "--plan"]])
def test_a_recorded_pin_commit_upstream_no_longer_has(pinned: Project, command: list[str]) -> None:
    # the build reads the pin before docker or the base image: no daemon is needed to see its refusal
    (pinned.root / "images").mkdir()
    (pinned.root / "images" / "tiny.yaml").write_text("image:\n  repository: test/vllm\n  tag: tiny\n")
    pin(pinned, "deadbeef" * 5)
    code, out = run(pinned, *command)
    assert code == 1, out
    assert "recorded commit deadbeefdead (v1.0) is not in the upstream repository" in out
    v10 = git(pinned.upstream.path, "rev-parse", "v1.0").strip()
    assert f"set pin.commit to {v10}" in out
    assert "fatal" not in out and "internal error" not in out


@pytest.mark.parametrize("command", [["status"], ["update", "--to", "v1.1"]])
def test_a_pin_tag_that_now_names_another_commit(pinned: Project, command: list[str]) -> None:
    old = git(pinned.upstream.path, "rev-parse", "v1.0").strip()
    pin(pinned, old)
    # upstream's history is rebuilt: every tag moves to a new commit (as adding an older release does)
    up = pinned.upstream.path
    older = git(up, "commit-tree", "v1.0^{tree}", "-m", "an older release").strip()
    v10 = git(up, "commit-tree", "v1.0^{tree}", "-p", older, "-m", "v1.0").strip()
    v11 = git(up, "commit-tree", "v1.1^{tree}", "-p", v10, "-m", "v1.1").strip()
    git(up, "tag", "-f", "v1.0", v10)
    git(up, "tag", "-f", "v1.1", v11)
    git(up, "reset", "-q", "--hard", v11)
    assert run(pinned, "fetch")[0] == 0
    code, out = run(pinned, *command)
    assert code == 1, out
    now = git(up, "rev-parse", "v1.0").strip()
    assert f"recorded as commit {old[:12]}, but upstream's v1.0 is now {now[:12]}" in out
    assert f"set pin.commit to {now}" in out
    assert "does not descend" not in out and "downgrade" not in out
