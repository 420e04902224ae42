"""The GitHub workflows: actionlint and zizmor (the test extras' wheels, offline) find nothing in any of them, and
the rebuild job's own shell steps, run under bash with a stand-in scripts/ci-rebuild (tests/helpers/
workflow_standins.py), decide as the job must: the pull request step, the warnings, the job's exit, and a `to`
input that is not a ref name refused before anything runs it."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import git
from helpers import workflow
from helpers.workflow import JobRun

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.y*ml"))
ACTIONLINT_CONFIG = ROOT / ".github" / "actionlint.yaml"
REBUILD = ROOT / ".github" / "workflows" / "vpatch-rebuild.yml"
STANDINS = ROOT / "tests" / "helpers" / "workflow_standins.py"
# The one run step left out, and why: it installs the checkout with pip, which the stand-in does not need and
# which would need the package index.
NOT_RUN = {"Install vpatch": "pip install -e . of the checkout"}
TOKEN = "ghs_standin_token_of_the_test"


def tool(name: str) -> str:
    """A linter from the test extras: beside this interpreter (the venv), else on PATH."""
    found = Path(sys.executable).parent / name
    path = str(found) if found.exists() else shutil.which(name)
    assert path, f"{name} is missing: `pip install -e '.[test]'` installs it (pyproject.toml's test extras)"
    return path


def actionlint(path: Path, *config: str) -> subprocess.CompletedProcess[str]:
    # shellcheck checks the run: scripts (its wheel is in the test extras too); pyflakes is not used
    return subprocess.run([tool("actionlint"), "-no-color", "-oneline", *config, "-shellcheck", tool("shellcheck"),
                           "-pyflakes=", str(path)], cwd=path.parent, capture_output=True, text=True, check=False)


def zizmor(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("zizmor"), "--offline", "--no-progress", "--color", "never", str(path)],
                          cwd=path.parent, capture_output=True, text=True, check=False)


def test_there_are_workflows() -> None:
    assert REBUILD in WORKFLOWS


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_actionlint_finds_nothing(path: Path) -> None:
    proc = actionlint(path, "-config-file", str(ACTIONLINT_CONFIG))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_zizmor_finds_nothing(path: Path) -> None:
    proc = zizmor(path)
    assert proc.returncode == 0 and "No findings" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_suppression_says_why_and_no_expression_is_in_a_script(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    bare = [line.strip() for line in text.splitlines()
            if re.search(r"(zizmor: ignore\[[^]]+\]|shellcheck disable=\S+)\s*(#\s*)?$", line)]
    assert not bare, f"suppressions without a reason in {path.name}: {bare}"
    doc = yaml.safe_load(text)
    scripts = [step["run"] for job in doc["jobs"].values() for step in job.get("steps", []) if "run" in step]
    assert scripts and not [s for s in scripts if "${{" in s], "an expression inside a run: script (use env:)"


def test_the_linters_see_what_the_issue_saw(tmp_path: Path) -> None:
    """The old job's faults, offline: an input expanded into the shell, node20 actions by tag, a checkout that
    keeps its token, an undeclared runner label (declared by .github/actionlint.yaml)."""
    bad = tmp_path / "bad.yml"
    bad.write_text("""\
on:
  workflow_dispatch:
    inputs:
      to:
        required: false
jobs:
  rebuild:
    runs-on: [self-hosted, linux, docker]
    steps:
      - uses: actions/checkout@v4
      - run: scripts/ci-rebuild --to "${{ github.event.inputs.to }}" > summary.json
      - uses: actions/upload-artifact@v4
        with:
          path: summary.json
""")
    found = actionlint(bad).stdout
    assert 'label "docker" is unknown' in found and 'runtime "node20" is deprecated' in found, found
    declared = actionlint(bad, "-config-file", str(ACTIONLINT_CONFIG)).stdout
    assert 'label "docker"' not in declared and "node20" in declared, declared
    found = zizmor(bad).stdout
    for audit in ("template-injection", "unpinned-uses", "artipacked"):
        assert f"[{audit}]" in found, found


# The rebuild job's shell steps.

def real_summary_keys() -> list[str]:
    """The keys of the summary scripts/ci-rebuild starts from (its `summary: dict[str, Any] = {...}`)."""
    tree = ast.parse((ROOT / "scripts" / "ci-rebuild").read_text(encoding="utf-8"))
    [literal] = [n.value for n in ast.walk(tree) if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                 and n.target.id == "summary" and isinstance(n.value, ast.Dict)]
    assert isinstance(literal, ast.Dict)
    return [str(k.value) for k in literal.keys if isinstance(k, ast.Constant)]


def summary(code: int, message: str, *, commit: str | None = None, after: str = "v0.29.0",
            attention: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    """A summary as scripts/ci-rebuild writes it (its keys, checked below), with what the job reads filled in."""
    written: dict[str, Any] = {"pin": {"before": "v0.29.0", "after": after}, "target": "v0.34.0", "landed": [],
                               "attention": [{"file": f, "state": "conflict", "why": why, "reasons": [], "runs": []}
                                             for f, why in attention],
                               "update": None, "dropped": [], "refreshed": [], "kept": [], "narrowed": [], "commit": commit,
                               "build": {"needed": False, "reason": None, "images": []}, "step": None, "blockers": [],
                               "furthest": None, "recovered": None, "no_local_patch_remains": False, "message": message,
                               "exit_code": code}
    if commit == "new":
        written |= {"subject": f"vpatch: update to {after}", "body": f"Pin: v0.29.0 -> {after}\n\nDropped: 0001"}
    return written


def test_the_stand_in_summary_has_the_real_keys() -> None:
    assert list(summary(0, "")) == real_summary_keys()


class Job:
    """A workspace (a real git repository whose origin is a bare one here), stand-ins for ci-rebuild and gh, and
    the rebuild job's run steps run in it."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path
        self.origin = tmp_path / "origin.git"
        self.workspace = tmp_path / "workspace"
        self.log = tmp_path / "standins.log"
        git(tmp_path, "init", "-q", "--bare", "-b", "main", str(self.origin))
        git(tmp_path, "init", "-q", "-b", "main", str(self.workspace))
        (self.workspace / "vpatch.yaml").write_text("pin: v0.29.0\n")
        git(self.workspace, "add", "-A")
        git(self.workspace, "commit", "-q", "-m", "the project")
        git(self.workspace, "remote", "add", "origin", str(self.origin))
        git(self.workspace, "push", "-q", "origin", "main")
        (self.workspace / "scripts").mkdir()
        shutil.copy(STANDINS, self.workspace / "scripts" / "ci-rebuild")
        (self.workspace / "scripts" / "ci-rebuild").chmod(0o755)
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        shutil.copy(STANDINS, self.bin / "gh")
        (self.bin / "gh").chmod(0o755)
        for name in ("python", "python3"):
            (self.bin / name).symlink_to(sys.executable)

    def run(self, code: int, written: dict[str, Any] | None, *, event: str = "schedule", to: str = "",
            before: str = "", gh_exit: int = 0) -> JobRun:
        env = workflow.scrubbed_environ() | {
            "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}", "STANDIN_LOG": str(self.log),
            "STANDIN_EXIT": str(code), "STANDIN_GH_EXIT": str(gh_exit), "STANDIN_SUMMARY": ""}
        if written is not None:
            (self.root / "summary-in.json").write_text(json.dumps(written))
            env["STANDIN_SUMMARY"] = str(self.root / "summary-in.json")
        contexts = {"inputs.to": to, "github.event_name": event, "github.event.before": before, "github.token": TOKEN,
                    "github.workspace": str(self.workspace)}
        return workflow.run_job(REBUILD, "rebuild", workspace=self.workspace, contexts=contexts, env=env, not_run=NOT_RUN)

    def calls(self, program: str) -> list[dict[str, Any]]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [c for c in map(json.loads, lines) if c["program"] == program]

    def pushed(self) -> dict[str, str]:
        refs = git(self.origin, "for-each-ref", "--format=%(refname) %(objectname)", "refs/heads/vpatch/")
        return dict(line.split() for line in refs.splitlines())


@pytest.fixture
def job(tmp_path: Path) -> Job:
    return Job(tmp_path)


def test_the_steps_left_out_are_steps_of_the_job() -> None:
    _, spec = workflow.load_job(REBUILD, "rebuild")
    assert set(NOT_RUN) <= {workflow.step_name(s) for s in workflow.run_steps(spec)}


def warnings(run: JobRun) -> list[str]:
    return [line for line in run.log.splitlines() if line.startswith("::warning::")]


def test_an_update_commit_gets_a_branch_and_a_pull_request(job: Job) -> None:
    run = job.run(0, summary(0, "pin moved v0.29.0 -> v0.34.0", commit="new", after="v0.34.0"))
    assert run.exit_code == 0, run.log
    head = git(job.workspace, "rev-parse", "HEAD").strip()
    assert job.pushed() == {"refs/heads/vpatch/update-v0.34.0": head}
    [gh] = job.calls("gh")
    assert gh == {"program": "gh", "token": True, "argv": [
        "pr", "create", "--head", "vpatch/update-v0.34.0", "--title", "vpatch: update to v0.34.0",
        "--body", "Pin: v0.29.0 -> v0.34.0\n\nDropped: 0001"]}
    # the token reached the pull request step only: ci-rebuild (which runs upstream code) never saw it
    [rebuild] = job.calls("ci-rebuild")
    assert rebuild == {"program": "ci-rebuild", "argv": ["--push"], "token": False}
    assert not run.step("A patch needs a person").ran and warnings(run) == []
    assert TOKEN not in run.log and TOKEN not in (job.workspace / ".git" / "config").read_text()


def test_nothing_to_do_opens_no_pull_request(job: Job) -> None:
    run = job.run(0, summary(0, "nothing to do: no patch has landed in v0.34.0"))
    assert run.exit_code == 0, run.log
    assert run.step("Pull request for the update commit").ran
    assert "no update commit" in run.step("Pull request for the update commit").output
    assert job.pushed() == {} and job.calls("gh") == []
    assert not run.step("A patch needs a person").ran


@pytest.mark.parametrize("code", [4, 5])
def test_a_patch_that_needs_a_person_warns_and_changes_nothing(job: Job, code: int) -> None:
    written = summary(code, "a person is needed: 0003-x.patch on v0.34.0\n::error::not a command",
                      attention=(("0003-x.patch", "conflict on v0.34.0: 100% of hunk 2"), ("0004-y.patch", "partial")))
    run = job.run(code, written)
    assert run.exit_code == 0, run.log  # the job succeeds; the warnings say what needs a person
    assert run.step("Rebuild").outputs == {"code": str(code)}
    assert not run.step("Pull request for the update commit").ran and job.pushed() == {} and job.calls("gh") == []
    assert warnings(run) == ["::warning::a person is needed: 0003-x.patch on v0.34.0%0A::error::not a command",
                             "::warning::0003-x.patch: conflict on v0.34.0: 100%25 of hunk 2",
                             "::warning::0004-y.patch: partial"]
    assert not [line for line in run.log.splitlines() if line.startswith("::error::")]


def test_a_pin_moved_short_of_the_target_gets_a_pull_request_and_warns(job: Job) -> None:
    written = summary(9, "pin moved v0.29.0 -> v0.31.0, short of v0.34.0", commit="new", after="v0.31.0",
                      attention=(("0002-parser-fix.patch", "conflict on v0.32.0: hunk 1"),))
    run = job.run(9, written)
    assert run.exit_code == 0, run.log
    assert list(job.pushed()) == ["refs/heads/vpatch/update-v0.31.0"] and len(job.calls("gh")) == 1
    assert warnings(run) == ["::warning::pin moved v0.29.0 -> v0.31.0, short of v0.34.0",
                             "::warning::0002-parser-fix.patch: conflict on v0.32.0: hunk 1"]


def test_a_pull_request_that_gh_refuses_still_leaves_the_branch(job: Job) -> None:
    run = job.run(0, summary(0, "pin moved", commit="new", after="v0.34.0"), gh_exit=1)
    assert run.exit_code == 0, run.log
    assert list(job.pushed()) == ["refs/heads/vpatch/update-v0.34.0"]
    assert "::notice::no new pull request for vpatch/update-v0.34.0" in run.log


@pytest.mark.parametrize(("code", "written"), [(1, summary(1, "vpatch status --json failed with exit code 2")),
                                               (70, None)], ids=["error-with-summary", "crash-without-summary"])
def test_a_failed_rebuild_fails_the_job_and_takes_no_further_step(job: Job, code: int, written: dict[str, Any] | None) -> None:
    run = job.run(code, written)
    assert run.exit_code == code
    assert run.step("Rebuild").exit_code == code and run.step("Rebuild").outputs == {"code": str(code)}
    assert not run.step("Pull request for the update commit").ran and not run.step("A patch needs a person").ran
    assert job.pushed() == {} and job.calls("gh") == []
    if written is not None:
        assert '"message": "vpatch status --json failed with exit code 2"' in run.step("Rebuild").output


@pytest.mark.parametrize(("event", "to", "before", "argv"), [
    ("schedule", "", "", ["--push"]),
    ("workflow_dispatch", "", "", ["--push"]),
    ("workflow_dispatch", "v0.34.0", "", ["--push", "--to", "v0.34.0"]),
    ("workflow_dispatch", "main", "", ["--push", "--to", "main"]),
    ("workflow_dispatch", "releases/v0.9", "", ["--push", "--to", "releases/v0.9"]),
    ("push", "", "4b825dc642cb6eb9a060e54bf8d69288fbee4904", ["--push", "--since", "4b825dc642cb6eb9a060e54bf8d69288fbee4904"]),
])
def test_the_event_and_the_input_reach_ci_rebuild_as_arguments(job: Job, event: str, to: str, before: str,
                                                                argv: list[str]) -> None:
    run = job.run(0, summary(0, "nothing to do"), event=event, to=to, before=before)
    assert run.exit_code == 0, run.log
    assert [c["argv"] for c in job.calls("ci-rebuild")] == [argv]


@pytest.mark.parametrize("to", [
    'v0.34.0"; touch PWNED; echo "', "$(touch PWNED)", "`touch PWNED`", "v0.34.0; touch PWNED", "v0.34.0\ntouch PWNED",
    "v0.34.0 && touch PWNED", "--help", "-x", "../../PWNED", "v0.34..HEAD", "refs/heads/x.lock", "x/", "v" * 101,
])
def test_a_to_input_that_is_not_a_ref_name_is_refused_not_run(job: Job, to: str) -> None:
    run = job.run(0, summary(0, "nothing to do"), event="workflow_dispatch", to=to)
    assert run.exit_code == 2
    check = run.step("Check the requested ref")
    assert check.exit_code == 2 and "::error::the 'to' input is not a ref name" in check.output
    assert not run.step("Rebuild").ran and job.calls("ci-rebuild") == []
    assert not list(job.root.rglob("PWNED")) and not (Path.cwd() / "PWNED").exists()
