"""scripts/ci-rebuild on toy projects: update when something landed, build when the pin moved, JSON + exit code."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import KV_FIXED, PARSER_V1, REAL_CACHE, Project, git
from helpers.project import commit_all, state_of
from helpers.shipped import committed_copy, shipped_files

from vpatch import git as vgit
from vpatch.config.project import Config

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "ci-rebuild"


def ci_rebuild(project: Project | Path, *args: str) -> tuple[int, dict, str]:
    root = project.root if isinstance(project, Project) else project
    proc = subprocess.run([sys.executable, str(SCRIPT), "--project", str(root), *args],
                          capture_output=True, text=True, env=dict(os.environ))
    return proc.returncode, json.loads(proc.stdout), proc.stderr


@pytest.fixture
def ci_project(project: Project) -> Project:
    """Two patches on v1.0, the repo's own image definition and Dockerfile, committed."""
    project.make_patch(1, "kv-skip-null", {"vllm/kv.py": KV_FIXED}, "Skip null blocks")
    project.make_patch(2, "parser-fix", {"vllm/parser.py": PARSER_V1.replace("line 20\n", "line 20 fixed\n")},
                       "Fix the parser")
    (project.root / "images").mkdir()
    shutil.copyfile(REPO_ROOT / "images" / "flash-next.yaml", project.root / "images" / "flash-next.yaml")
    shutil.copyfile(REPO_ROOT / "Dockerfile", project.root / "Dockerfile")
    # flash-next.yaml's deploy: section names its question file, which a project carries beside images/.
    shutil.copytree(REPO_ROOT / "checks", project.root / "checks", dirs_exist_ok=True)
    commit_all(project)
    return project


def test_nothing_landed_means_nothing_to_do(ci_project: Project) -> None:
    ci_project.upstream.commit({"README": "toy vllm 1.1\n"}, "v1.1", tag="v1.1")
    before = state_of(ci_project)
    code, summary, err = ci_rebuild(ci_project)
    assert code == 0, err
    assert summary["target"] == "v1.1" and summary["landed"] == [] and summary["update"] is None
    assert summary["build"]["needed"] is False
    assert summary["message"] == "nothing to do: no patch has landed in v1.1"
    assert state_of(ci_project) == before


def test_a_conflict_on_the_only_step_needs_a_person_and_changes_nothing(ci_project: Project) -> None:
    ci_project.upstream.commit({"vllm/kv.py": KV_FIXED, "vllm/parser.py": PARSER_V1.replace("line 20\n", "line XX\n")},
                               "v1.1", tag="v1.1")
    before = state_of(ci_project)
    code, summary, err = ci_rebuild(ci_project, "--no-build")
    # 0001 landed, but 0002 conflicts in the same release: there is no step short of it, so nothing moves
    assert code == 4, err
    assert summary["landed"] == ["0001-kv-skip-null.patch"] and summary["update"] == "blocked"
    [entry] = summary["attention"]
    assert entry["file"] == "0002-parser-fix.patch" and [(r["ref"], r["state"]) for r in entry["reasons"]] == [
        ("v1.1", "conflict")]
    assert entry["runs"] == ["vpatch update --to v1.1: it stops at 0002-parser-fix.patch; resolve it in "
                             ".git/vpatch-update/tree, `git add`, vpatch update --continue"]
    assert "Nothing was changed" in summary["message"]
    assert state_of(ci_project) == before
    # all or nothing, as before --furthest: the update stops at 0002 and is aborted
    code, summary, err = ci_rebuild(ci_project, "--no-build", "--no-furthest")
    assert code == 5, err
    assert summary["attention"][0]["file"] == "0002-parser-fix.patch" and len(summary["attention"]) == 1
    assert "stopped at 0002-parser-fix.patch" in summary["message"] and "Nothing was changed" in summary["message"]
    assert state_of(ci_project) == before
    assert not (ci_project.root / ".git" / "vpatch-update").exists()


def test_drops_what_landed_before_the_release_that_conflicts(ci_project: Project) -> None:
    ci_project.upstream.commit({"vllm/kv.py": KV_FIXED}, "v1.1", tag="v1.1")
    ci_project.upstream.commit({"vllm/parser.py": PARSER_V1.replace("line 20\n", "line XX\n")}, "v1.2", tag="v1.2")
    code, summary, err = ci_rebuild(ci_project, "--no-build")
    assert code == 9, err
    assert summary["target"] == "v1.2" and summary["step"] == "v1.1"
    assert summary["pin"] == {"before": "v1.0", "after": "v1.1"}
    assert summary["dropped"] == ["0001-kv-skip-null.patch"] and summary["kept"] == ["0002-parser-fix.patch"]
    assert summary["commit"] == git(ci_project.root, "rev-parse", "HEAD").strip()
    assert summary["build"]["needed"] and "the update to v1.1 committed" in summary["build"]["reason"]
    # 0002 once, with its conflict on v1.2 once (status on the target and the update's blocker say it alike)
    [entry] = summary["attention"]
    assert entry["file"] == "0002-parser-fix.patch"
    assert [(r["ref"], r["state"]) for r in entry["reasons"]] == [("v1.2", "conflict")]
    [blocker] = summary["blockers"]
    assert (blocker["file"], blocker["case"], blocker["ref"]) == ("0002-parser-fix.patch", "conflict", "v1.2")
    assert "short of v1.2" in summary["message"] and "0002-parser-fix.patch needs a person at v1.2" in summary["message"]
    assert "; would build 1 image(s) (--no-build);" in summary["message"]  # it built nothing
    # the PR body (the commit's body) says where the pin went, what was dropped and what blocks
    body = git(ci_project.root, "log", "-1", "--format=%b")
    assert "Pin: v1.0" in body and "-> v1.1" in body and "- 0001-kv-skip-null.patch: Skip null blocks" in body
    assert "Not further: v1.2 needs a person (the target was v1.2):\n- 0002-parser-fix.patch: conflict from v1.2" in body


def test_tracking_the_branch_moves_to_the_last_commit_before_the_blocker(ci_project: Project) -> None:
    shas = ci_project.upstream.grow(
        (f"upstream commit {i}", {"vllm/kv.py": KV_FIXED} if i == 2 else
         {"vllm/parser.py": PARSER_V1.replace("line 20\n", "line XX\n")} if i == 6 else {"notes.txt": f"{i}\n"})
        for i in range(1, 11))
    code, summary, err = ci_rebuild(ci_project, "--no-build", "--track", "branch")
    assert code == 9, err
    assert summary["target"] == "main" and summary["step"] == shas[4][:12]
    assert Config.load(ci_project.root).pin.commit == shas[4]
    assert summary["dropped"] == ["0001-kv-skip-null.patch"]
    [blocker] = summary["blockers"]
    assert (blocker["file"], blocker["commit"]) == ("0002-parser-fix.patch", shas[5])
    assert summary["furthest"]["mode"] == "commits" and summary["furthest"]["checks"] <= 4 + 2  # ceil(log2 10) + 2


def test_a_kill_at_the_commit_point_is_finished_by_the_next_run(ci_project: Project) -> None:
    """The update killed (kill -9) just after the branch moved, before the files were checked out: the next
    run finishes the committed step (every check had passed) and reports it."""
    from helpers import killat

    ci_project.upstream.commit({"vllm/kv.py": KV_FIXED}, "v1.1", tag="v1.1")
    ci_project.upstream.commit({"vllm/parser.py": PARSER_V1.replace("line 20\n", "line XX\n")}, "v1.2", tag="v1.2")
    assert subprocess.run([sys.executable, "-m", "vpatch", "--project", str(ci_project.root), "fetch"],
                          capture_output=True).returncode == 0
    killed = subprocess.run([sys.executable, str(killat.HERE), "committed", "--project", str(ci_project.root), "update",
                             "--to", "v1.2", "--furthest"], capture_output=True, text=True)
    assert killed.returncode == -9, killed.stdout + killed.stderr
    code, summary, err = ci_rebuild(ci_project, "--no-build", "--no-fetch")
    assert code == 9, err
    assert summary["recovered"]["outcome"] == "committed"
    assert summary["pin"] == {"before": "v1.0", "after": "v1.1"} and summary["build"]["needed"]
    assert git(ci_project.root, "status", "--porcelain") == ""
    assert Config.load(ci_project.root).pin.ref == "v1.1"
    assert [a["file"] for a in summary["attention"]] == ["0002-parser-fix.patch"]


def test_landed_patch_is_dropped_and_build_is_reported_without_docker(ci_project: Project) -> None:
    """The build itself is skipped here (--no-build); the test below builds for real where docker runs."""
    ci_project.upstream.commit({"vllm/kv.py": KV_FIXED}, "v1.1", tag="v1.1")
    code, summary, err = ci_rebuild(ci_project, "--no-build")
    assert code == 0, err
    assert summary["dropped"] == ["0001-kv-skip-null.patch"] and summary["kept"] == ["0002-parser-fix.patch"]
    assert summary["pin"] == {"before": "v1.0", "after": "v1.1"}
    assert summary["commit"] == git(ci_project.root, "rev-parse", "HEAD").strip()
    assert summary["build"]["needed"] and summary["build"]["images"] == [
        {"image": "flash-next", "tags": [], "skipped": "--no-build"}]
    # a second run has nothing left to do, but --since the first commit still asks for a build
    first = git(ci_project.root, "rev-list", "--max-parents=0", "HEAD").strip()
    code, summary, err = ci_rebuild(ci_project, "--no-build")
    assert code == 0 and summary["update"] is None and not summary["build"]["needed"]
    code, summary, err = ci_rebuild(ci_project, "--no-build", "--since", first)
    assert code == 0 and summary["build"]["needed"] and "changed since" in summary["build"]["reason"]


def test_every_patch_landed_says_the_official_image_suffices(ci_project: Project) -> None:
    ci_project.upstream.commit({"vllm/kv.py": KV_FIXED, "vllm/parser.py": PARSER_V1.replace("line 20\n", "line 20 fixed\n")},
                               "v2.0", tag="v2.0")
    code, summary, err = ci_rebuild(ci_project, "--no-build")
    assert code == 0, err
    assert summary["no_local_patch_remains"] is True
    assert "the official vLLM v2.0 image now suffices" in summary["message"]


def test_error_gives_exit_1_and_names_the_step(ci_project: Project) -> None:
    code, summary, _ = ci_rebuild(ci_project, "--to", "v9.9", "--no-fetch")
    assert code == 1
    assert summary["error"]["step"].startswith("vpatch status --json --against v9.9")
    assert "unknown upstream ref 'v9.9'" in summary["error"]["stderr"]


@pytest.mark.releases
def test_the_shipped_project_moves_to_v0_34_0_dropping_0001_0002_and_narrowing_0003(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release_history: Path) -> None:
    """The CI job on the real release history, from a fresh copy of the shipped project (pin v0.29.0), to the
    newest release it holds, v0.34.0 (issue 43): 0001 and 0002 landed long ago; 0003's qwen3.py hunk no longer
    applies (upstream rewrote those transitions itself in v0.33.0) and its probe proves the rest, its
    parser_engine.py hunk, is still needed, so 0003 is carried narrowed, with no person."""
    from vpatch.upstream import releases

    monkeypatch.setenv("VPATCH_CACHE", str(REAL_CACHE))
    releases.ensure_history(["0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0"], cache=REAL_CACHE)
    root = committed_copy(tmp_path / "project", shipped_files())
    head = git(root, "rev-parse", "HEAD")
    # the dry run makes the same choice and changes nothing
    dry = subprocess.run([sys.executable, "-m", "vpatch", "--project", str(root), "update", "--to", "v0.34.0",
                          "--furthest", "--dry-run", "--json"], capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    planned = json.loads(dry.stdout)
    assert git(root, "rev-parse", "HEAD") == head and git(root, "status", "--porcelain") == ""
    # one Witness for the whole command: one warm interpreter, started once, when the first probe runs (none on a
    # result cache that answers them all). It was started per judging and per validation (four in this run on an
    # empty result cache), every tree extracted again for each.
    starts = len(re.findall(r"^probe zygote: started(?! again)", dry.stderr, re.M))
    assert starts == (1 if re.search(r"^probe \S+ on .*: running$", dry.stderr, re.M) else 0), dry.stderr
    started = time.monotonic()
    code, summary, err = ci_rebuild(root, "--to", "v0.34.0", "--no-build", "--no-fetch")
    seconds = time.monotonic() - started
    assert code == 0, err
    assert planned["furthest"]["step"]["ref"] == summary["step"] == "v0.34.0"
    assert planned["dropped"] == summary["dropped"] == ["0001-qsa-fp8-kv.patch", "0002-mamba-null-gap-free.patch"]
    assert summary["pin"] == {"before": "v0.29.0", "after": "v0.34.0"}
    assert summary["narrowed"] == ["0003-qwen3-tool-call-unclosed-function.patch"]
    assert summary["attention"] == [] and summary["blockers"] == []
    assert sorted(p.name for p in (root / "patches").glob("*.patch")) == ["0003-qwen3-tool-call-unclosed-function.patch"]
    assert Config.load(root).pin.ref == "v0.34.0" and git(root, "status", "--porcelain") == ""
    narrowed = (root / "patches" / "0003-qwen3-tool-call-unclosed-function.patch").read_text()
    assert "diff --git a/vllm/parser/qwen3.py" not in narrowed
    assert "diff --git a/vllm/parser/engine/parser_engine.py" in narrowed
    assert "- vllm/parser/qwen3.py hunk 1 (@@ -168,6 +168,29 @@)\n  Rewritten-Upstream: since v0.29.0 by: " in narrowed
    assert "narrowed 0003-qwen3-tool-call-unclosed-function.patch" in summary["message"]
    # the evidence and the first releases, in RETIRED.md and in the commit (the PR's body)
    retired = (root / "patches" / "RETIRED.md").read_text()
    message = git(root, "log", "-1", "--format=%B")
    assert message.startswith("Update upstream pin v0.29.0 -> v0.34.0: drop 0001, 0002, narrow 0003")
    for name, release in (("0001-qsa-fp8-kv", "v0.31.0"), ("0002-mamba-null-gap-free", "v0.30.0")):
        section = retired.split(f"## {name}\n")[1].split("\n## ")[0]
        # one release: the first that has it, not the step the pin went to
        assert section.split("Applied-Upstream:")[1].splitlines()[0].startswith(f" {release} (first commit "), section
        assert f"Applied-Upstream: {release} (" in message.split(f"- {name}.patch: ")[1].split("Evidence:")[0]
    assert "## 0003-qwen3-tool-call-unclosed-function (narrowed)" in retired
    print(f"ci-rebuild on the real history, shipped project, to v0.34.0: {seconds:.1f}s")


@pytest.mark.docker
def test_update_then_real_build_on_the_new_pin(ci_project: Project) -> None:
    """The whole job with a real docker build: the base image is made from the toy v1.1 tree."""
    from helpers.imagebase import ensure_base

    from vpatch.docker import Docker, DockerError

    try:
        docker = Docker.connect()
    except DockerError as exc:
        if os.environ.get("CI") or shutil.which("dockerd"):
            raise
        pytest.skip(f"no docker here ({exc.message})")
    ci_project.upstream.commit({"vllm/kv.py": KV_FIXED}, "v1.1", tag="v1.1")
    up = ci_project.upstream.path
    tree = vgit.run(up, ["rev-parse", "v1.1:vllm"]).out.strip()
    base = ensure_base(docker, "toy-1.1", package_tar=lambda: vgit.run(up, ["archive", "--format=tar", "v1.1", "vllm"]).stdout,
                       fingerprint=tree)
    code, summary, err = ci_rebuild(ci_project, "--base", base)
    assert code == 0, err
    assert summary["dropped"] == ["0001-kv-skip-null.patch"]
    [image] = summary["build"]["images"]
    definition = yaml.safe_load((ci_project.root / "images" / "flash-next.yaml").read_text())["image"]
    repo = f"{definition['registry']}/{definition['repository']}"
    assert f"{repo}:{definition['tag']}" in image["tags"]
    assert any(t.startswith(f"{repo}:") and "-vp" in t for t in image["tags"]), image
    assert Config.load(ci_project.root).pin.ref == "v1.1"


def test_the_example_workflow_is_valid_yaml_and_runs_the_script() -> None:
    workflow = yaml.safe_load((REPO_ROOT / ".github" / "workflows" / "vpatch-rebuild.yml").read_text())
    triggers = workflow[True]  # YAML 1.1 reads the key `on` as true; GitHub reads it as "on"
    assert set(triggers) == {"schedule", "push", "workflow_dispatch"}
    assert triggers["push"]["paths"] == ["patches/**", "vpatch.yaml"]
    steps = workflow["jobs"]["rebuild"]["steps"]
    assert any("scripts/ci-rebuild" in step.get("run", "") for step in steps)
