"""Runs a GitHub Actions job's `run:` steps here, under bash, as the runner runs them: each step's script in a
file, the workflow's, job's and step's `env:`, GITHUB_OUTPUT per step, `if:` read from earlier steps' outputs,
and the steps after a failed one skipped. `uses:` steps are not run (they are GitHub's actions); a run step the
test cannot run here is named by the test with its reason. Only the expressions the test supplies are expanded
(in `env:`); an expression or `if:` form this runner does not know is an error, never a guess."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
# bash as the runner starts it: `shell: bash` (the job's default here), or no shell named (bash -e)
SHELLS = {"bash": ["bash", "--noprofile", "--norc", "-eo", "pipefail"], None: ["bash", "-e"]}
IF_TERM = re.compile(r"steps\.([\w-]+)\.outputs\.([\w-]+)\s*(==|!=)\s*'([^']*)'")


@dataclass
class StepRun:
    name: str
    ran: bool
    exit_code: int | None = None
    output: str = ""  # stdout and stderr together, as the job's log shows them
    outputs: dict[str, str] = field(default_factory=dict)


@dataclass
class JobRun:
    steps: list[StepRun]

    def step(self, name: str) -> StepRun:
        [found] = [s for s in self.steps if s.name == name]
        return found

    @property
    def exit_code(self) -> int:
        """The job's result as GitHub sees it: the first failed step's exit code, else 0."""
        return next((s.exit_code for s in self.steps if s.ran and s.exit_code), 0)

    @property
    def log(self) -> str:
        return "".join(s.output for s in self.steps)


def load_job(workflow: Path, job: str) -> tuple[dict[str, Any], dict[str, Any]]:
    doc = yaml.safe_load(workflow.read_text(encoding="utf-8"))
    return doc, doc["jobs"][job]


def step_name(step: dict[str, Any]) -> str:
    return str(step.get("name") or step.get("uses") or step["run"].splitlines()[0])


def run_steps(job: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in job["steps"] if "run" in s]


def expand(value: Any, contexts: dict[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        if match.group(1) not in contexts:
            raise KeyError(f"the test gives no value for ${{{{ {match.group(1)} }}}}")
        return contexts[match.group(1)]

    return EXPRESSION.sub(one, str(value))


def condition(text: str | bool | None, outputs: dict[str, dict[str, str]]) -> bool:
    """A step's `if:`: `||` of `&&` of comparisons of an earlier step's output with a literal."""
    if text is None:
        return True
    body = EXPRESSION.fullmatch(str(text).strip())
    text = body.group(1) if body else str(text).strip()
    verdicts = []
    for alternative in text.split("||"):
        terms = []
        for term in alternative.split("&&"):
            match = IF_TERM.fullmatch(term.strip())
            if match is None:
                raise ValueError(f"this runner cannot evaluate `if: {text}` (the term {term.strip()!r})")
            step_id, name, op, literal = match.groups()
            value = outputs.get(step_id, {}).get(name, "")
            terms.append((value == literal) == (op == "=="))
        verdicts.append(all(terms))
    return any(verdicts)


def read_outputs(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        name, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"GITHUB_OUTPUT line this runner does not read: {line!r}")
        found[name] = value
    return found


def run_job(workflow: Path, job_id: str, *, workspace: Path, contexts: dict[str, str], env: dict[str, str],
            not_run: dict[str, str]) -> JobRun:
    """Run the job's `run:` steps in `workspace`; `not_run` names the run steps left out, each with its reason."""
    doc, job = load_job(workflow, job_id)
    shell = SHELLS[(job.get("defaults") or {}).get("run", {}).get("shell")]
    base = {**env, **{k: expand(v, contexts) for k, v in {**(doc.get("env") or {}), **(job.get("env") or {})}.items()},
            "GITHUB_WORKSPACE": str(workspace), "CI": "true", "GITHUB_ACTIONS": "true"}
    outputs: dict[str, dict[str, str]] = {}
    runs: list[StepRun] = []
    failed = False
    for number, step in enumerate(job["steps"]):
        name = step_name(step)
        if "run" not in step or name in not_run or failed or not condition(step.get("if"), outputs):
            runs.append(StepRun(name, ran=False))
            continue
        if "shell" in step:
            raise ValueError(f"step {name!r} names its own shell; this runner runs the job's default only")
        script = workspace.parent / f"step-{number}.sh"
        script.write_text(step["run"], encoding="utf-8")
        out = workspace.parent / f"step-{number}.out"
        out.write_text("")
        step_env = {**base, **{k: expand(v, contexts) for k, v in (step.get("env") or {}).items()}, "GITHUB_OUTPUT": str(out)}
        proc = subprocess.run([*shell, str(script)], cwd=workspace, env=step_env, capture_output=True, text=True, check=False)
        run = StepRun(name, ran=True, exit_code=proc.returncode, output=proc.stdout + proc.stderr, outputs=read_outputs(out))
        if "id" in step:
            outputs[step["id"]] = run.outputs
        failed = proc.returncode != 0
        runs.append(run)
    return JobRun(runs)


def scrubbed_environ() -> dict[str, str]:
    """The test's environment less what a runner would not have: no GitHub token of the machine's user."""
    return {k: v for k, v in os.environ.items() if k not in ("GH_TOKEN", "GITHUB_TOKEN", "GITHUB_OUTPUT")}
