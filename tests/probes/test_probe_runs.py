"""One command's probe runs (probe_runs.py): each tree extracted once and shared, runs in parallel up to --jobs with
the same output and cache entries as one at a time, `probe check` stopping at the first side that errors, and a
command killed by SIGKILL leaving no probe running and (by the next command) no extracted tree."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import KV_FIXED, PARSER_FIXED, Project, ToyUpstream
from conftest import vpatch_cli as run
from helpers.pids import gone

from vpatch.base.paths import cache_dir
from vpatch.probes import workspace as probe_workspace

# Exit 0 when the tree has the fix its probe looks for, 1 when not. It logs where it ran, and which fixes the tree
# had, to runs.log next to it; with BARRIER set, on the pin's tree (neither fix) it waits (30 s at most) until
# every probe named there has started on it, so it decides only when the probes ran at the same time.
SCRIPT = """\
import json, os, pathlib, sys, time
here = pathlib.Path(__file__)
name = here.stem
kv = "continue" in pathlib.Path("vllm/kv.py").read_text()
parser = "fixed" in pathlib.Path("vllm/parser.py").read_text()
with open(here.with_name("runs.log"), "a") as log:
    log.write(json.dumps({"probe": name, "cwd": os.getcwd(), "tree": [kv, parser],
                          "pid": os.getpid(), "argv0": sys.argv[0]}) + "\\n")
barrier = os.environ.get("BARRIER")
if barrier and not kv and not parser:
    folder = pathlib.Path(barrier) / "pin"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).touch()
    deadline = time.monotonic() + 30
    while {p.name for p in folder.iterdir()} < set(os.environ["BARRIER_NAMES"].split(",")):
        if time.monotonic() > deadline:
            print("the other probe never ran at the same time")
            sys.exit(2)
        time.sleep(0.05)
fixed = kv if name == "kv" else parser
print(name, "fixed" if fixed else "not fixed")
sys.exit(0 if fixed else 1)
"""

PROBE = 'kind: command\nrun: ["{{python}}", "{{probe_dir}}/{name}.py"]\nrequirements: []\ntimeout: {timeout}\n'


def two_probes(project: Project, script: str = SCRIPT, timeout: int = 120) -> None:
    """0001 (vllm/kv.py) and 0002 (vllm/parser.py), each with a command probe running `script`."""
    probes = project.patches / "probes"
    probes.mkdir(exist_ok=True)
    for number, name, files in ((1, "kv", {"vllm/kv.py": KV_FIXED}), (2, "parser", {"vllm/parser.py": PARSER_FIXED})):
        (probes / f"{name}.py").write_text(script)
        (probes / f"{name}.yaml").write_text(PROBE.format(name=name, timeout=timeout))
        project.make_patch(number, name, files, f"fix {name}",
                           trailers=f"Origin: vendor\nProbe: probes/{name}.yaml\nLast-Update: 2026-09-01")


def runs_log(project: Project) -> list[dict[str, object]]:
    path = project.patches / "probes" / "runs.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def leftovers() -> list[str]:
    runs = cache_dir() / "probe-runs"
    return sorted(p.name for p in runs.iterdir()) if runs.is_dir() else []


def test_every_probe_on_a_tree_runs_in_the_one_extraction_which_goes_at_the_end(project: Project) -> None:
    two_probes(project)

    code, out = run(project, "status", "--jobs", "1")

    assert code == 0, out
    on_pin = [r for r in runs_log(project) if r["tree"] == [False, False]]
    assert sorted(r["probe"] for r in on_pin) == ["kv", "parser"]
    assert on_pin[0]["cwd"] == on_pin[1]["cwd"]  # one tree, extracted once, both probes in it
    # the probe is run as `python probe.py` would be: its own path as argv[0], cwd the tree root
    assert all(str(r["argv0"]).endswith(f"/{r['probe']}.py") for r in runs_log(project))
    assert leftovers() == []


def test_the_probes_run_at_the_same_time_with_jobs_2(project: Project, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    two_probes(project)
    # each probe on the pin waits until the other has started there: they decide only when run at once
    monkeypatch.setenv("BARRIER", str(tmp_path / "barrier"))
    monkeypatch.setenv("BARRIER_NAMES", "kv,parser")

    code, out = run(project, "status", "--jobs", "2", "--json")

    assert code == 0, out
    assert "never ran at the same time" not in out
    assert sorted(p.name for p in (tmp_path / "barrier" / "pin").iterdir()) == ["kv", "parser"]


def test_a_run_says_running_and_is_timed_only_once_it_has_its_place(tmp_path: Path) -> None:
    """Two runs asked for at once in a session of one place: the second says `running` only when the first has
    ended (stderr never shows more runs at once than --jobs), and each run's seconds are the time it held its place,
    not the wait behind the other (timed from when it was asked for, the two would add up to more than both took)."""
    from concurrent.futures import ThreadPoolExecutor

    from vpatch.base import Event

    events: list[Event] = []
    lock = threading.Lock()

    def report(event: Event) -> None:
        with lock:
            events.append(event)

    def one(session: probe_workspace.Session, subject: str) -> float:
        running = probe_workspace.Running(report, subject, "1 file")
        with running.place(session):
            time.sleep(0.3)
            report(Event(subject, "leaving its place"))
        return running.seconds

    with probe_workspace.Session(cache=tmp_path, jobs=1, zygote=False) as session, \
            ThreadPoolExecutor(max_workers=2) as pool:
        started = time.monotonic()
        timed = list(pool.map(lambda subject: one(session, subject), ["run a", "run b"]))
        took = time.monotonic() - started

    steps = [(event.subject, event.step) for event in events]
    first, second = steps[0][0], steps[2][0]
    assert {first, second} == {"run a", "run b"}, steps
    assert steps == [(first, "running"), (first, "leaving its place"), (second, "running"),
                     (second, "leaving its place")], steps
    assert events[0].detail == "1 file"
    assert all(seconds >= 0.3 for seconds in timed) and sum(timed) <= took, (timed, took)


def _without_seconds(value: object) -> object:
    if isinstance(value, dict):
        return {k: _without_seconds(v) for k, v in value.items() if k != "seconds"}
    if isinstance(value, list):
        return [_without_seconds(v) for v in value]
    return value


def _cache_entries() -> dict[str, object]:
    results = cache_dir() / "probe-results"
    return {str(p.relative_to(results)): _without_seconds(json.loads(p.read_text()))
            for p in sorted(results.rglob("*.json"))}


def _status_json(project: Project, *args: str) -> str:
    from typer.testing import CliRunner

    from vpatch.commands.cli import app

    result = CliRunner().invoke(app, ["--project", str(project.root), "status", "--json", *args])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_jobs_change_neither_the_output_nor_the_cache_entries(project: Project) -> None:
    import shutil

    two_probes(project)
    serial = _status_json(project, "--jobs", "1", "--against", "v1.0")
    entries = _cache_entries()
    shutil.rmtree(cache_dir() / "probe-results")

    parallel = _status_json(project, "--jobs", "4", "--against", "v1.0")

    assert _without_seconds(json.loads(parallel)) == _without_seconds(json.loads(serial))
    assert _cache_entries() == entries and len(entries) == 4  # each probe on the pin and with its patch
    assert json.loads(parallel)["probes"]["run"] == 4


# The pin's side errors at once, but only after the side with the patch has started (it then sleeps): the
# check must stop that run and say it did not run.
STOPPED = """\
import os, pathlib, sys, time
here = pathlib.Path(__file__)
fixed = "continue" in pathlib.Path("vllm/kv.py").read_text()
started = here.with_name("with-patch.pid")
if fixed:
    started.write_text(str(os.getpid()))
    time.sleep(600)
    sys.exit(0)
deadline = time.monotonic() + 60
while not started.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
print("cannot run the scenario on this tree")
sys.exit(2)
"""


def test_probe_check_stops_the_other_side_when_the_pin_side_errors(project: Project) -> None:
    probes = project.patches / "probes"
    probes.mkdir()
    (probes / "kv.py").write_text(STOPPED)
    (probes / "kv.yaml").write_text(PROBE.format(name="kv", timeout=900))
    project.make_patch(1, "kv", {"vllm/kv.py": KV_FIXED}, "fix kv",
                       trailers="Origin: vendor\nProbe: probes/kv.yaml\nLast-Update: 2026-09-01")

    code, out = run(project, "probe", "check", "1", "--jobs", "2")

    assert code == 1, out
    assert "kv.yaml on v1.0 (" in out and ": ERROR" in out and "cannot run the scenario" in out
    assert "kv.yaml on v1.0 + the series up to 0001-kv: not run (the other side errored" in out
    assert "stopped there (one error already makes the probe invalid): not run with the patch" in out
    pid = int((probes / "with-patch.pid").read_text())
    stopped = gone(pid, within=30)
    if not stopped:
        os.kill(pid, signal.SIGKILL)
    assert stopped, "the run with the patch was not stopped"
    assert leftovers() == []


# Each probe starts a child of its own (what a probe's workers would be), says both pids, and sleeps.
SLEEPER = """\
import os, pathlib, subprocess, sys, time
here = pathlib.Path(__file__)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
fixed = "continue" in pathlib.Path("vllm/kv.py").read_text() or "fixed" in pathlib.Path("vllm/parser.py").read_text()
(here.parent / f"{here.stem}-{fixed}.pids").write_text(f"{os.getpid()} {child.pid}")
time.sleep(600)
"""


def test_a_sigkill_during_parallel_runs_leaves_no_probe_running_no_zygote_and_no_tree(project: Project) -> None:
    two_probes(project, SLEEPER, timeout=900)
    probes = project.patches / "probes"
    command = subprocess.Popen([sys.executable, "-m", "vpatch", "--project", str(project.root), "status", "--jobs", "2"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env={**os.environ, "VPATCH_PROBE_ZYGOTE": "1"})
    try:
        deadline = time.monotonic() + 120
        while len(list(probes.glob("*.pids"))) < 2:
            assert command.poll() is None and time.monotonic() < deadline, "the two probes never ran at once"
            time.sleep(0.05)
        assert any(name.startswith(f"run-{command.pid}-") for name in leftovers())
        pids = [int(pid) for path in probes.glob("*.pids") for pid in path.read_text().split()]
        zygotes = _zygotes_of(command.pid)  # the probes ran in children of the venv's warm interpreter
        assert len(zygotes) == 1, zygotes
        pids += zygotes
    finally:
        command.send_signal(signal.SIGKILL)
        command.wait()

    # the probes, what they started and the zygote end with the command, however it ended
    survivors = [pid for pid in pids if not gone(pid, within=30)]
    for pid in survivors:  # the test leaves nothing running when it fails
        os.kill(pid, signal.SIGKILL)
    assert not survivors, "a probe or the zygote outlived the command killed by SIGKILL"
    # its extracted trees are removed by the next command, whatever it runs
    code, out = run(project, "status", "--no-probes")
    assert code == 0, out
    assert leftovers() == []


def _zygotes_of(pid: int) -> list[int]:
    """The warm interpreters (probes/zygote.py) that vpatch process `pid` started: its children whose argv names
    it (their own children, the probe runs, are forks with the same argv)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if proc.name.isdigit() and parent == pid and any(f"/vpatch-zygote-{pid}-".encode() in a for a in argv):
            found.append(int(proc.name))
    return found


def test_a_run_folder_of_a_live_process_stays(project: Project) -> None:
    runs = cache_dir() / "probe-runs"
    live = runs / f"run-{os.getppid()}-abcd"
    (live / "tree").mkdir(parents=True)

    code, out = run(project, "status", "--no-probes")

    assert code == 0, out
    assert leftovers() == [live.name]


@pytest.mark.parametrize(("code", "says"), [("sys.exit(3)", "exit code 3 "), ("os.kill(os.getpid(), signal.SIGABRT)",
                                                                             "exit code -6 ")])
def test_the_supervisor_passes_on_the_probe_s_exit_code_or_signal(toy_upstream: ToyUpstream, tmp_path: Path,
                                                                   code: str, says: str) -> None:
    from helpers.probefiles import write_probe

    from vpatch.probes import runner as probes
    from vpatch.probes.runner import ProbeOutcome

    probe = write_probe(tmp_path / "probes", "kind: command\nrun: [\"{python}\", \"{probe_dir}/check.py\"]\n",
                        f"import os, signal, sys\nprint('about to end')\n{code}\n")
    result = probes.run_probe(toy_upstream.path, probe, "v1.0", cache=tmp_path / "cache")

    assert result.outcome is ProbeOutcome.ERROR
    assert result.detail.startswith(says) and result.detail.endswith("about to end"), result.detail


def test_probe_check_runs_a_lone_probe_fresh_unless_a_warm_interpreter_pays(project: Project,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VPATCH_PROBE_ZYGOTE", raising=False)
    # each run lasts half a second: the warm interpreter learns the first run's modules (in this tiny venv, a fraction
    # of a second) before the command ends, so that it records its list (a learning the command's end interrupts
    # records nothing; with runs of a few milliseconds that raced the command's end, and lost once in CI)
    two_probes(project, SCRIPT.replace("import json,", "__import__('time').sleep(0.5)\nimport json,", 1))

    # its sides and one run without its hunk, 2 at a time: 2 rounds, which a warm interpreter's imports do not pay
    code, out = run(project, "probe", "check", "1", "--jobs", "2", "--no-cache")

    assert code == 0, out
    assert "ok: kv.yaml fails without the patch and passes with it" in out
    assert "probe zygote" not in out, out
    assert leftovers() == []

    # one at a time, 3 rounds: through the warm interpreter, with the same verdicts
    code, warm = run(project, "probe", "check", "1", "--jobs", "1", "--no-cache")

    assert code == 0, warm
    assert "probe zygote" in warm, warm
    assert _verdicts(out) and _verdicts(out) == _verdicts(warm)

    # that run recorded the venv's list: 2 rounds now pay (its import is seconds, nothing to learn)
    assert list(cache_dir().glob("probe-venvs/*/vpatch-preload.json"))
    code, listed = run(project, "probe", "check", "1", "--jobs", "2", "--no-cache")

    assert code == 0, listed
    assert "probe zygote" in listed and "importing" in listed, listed
    assert _verdicts(listed) == _verdicts(out)


def test_runs_beyond_the_cores_count_as_rounds_for_the_warm_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--jobs 6` on two cores: the six runs share the two cores, 3 rounds of imports, so a warm interpreter that must
    learn its list first pays as it does for 6 runs 2 at a time; 2 runs are one round however many jobs."""
    monkeypatch.delenv("VPATCH_PROBE_ZYGOTE", raising=False)
    monkeypatch.setattr(probe_workspace, "default_jobs", lambda: 2)

    assert probe_workspace.zygote_pays(6, 6) == probe_workspace.zygote_pays(6, 2) is True  # 3 rounds, no list
    assert probe_workspace.zygote_pays(4, 6) is False  # 2 rounds on 2 cores, not 1
    assert probe_workspace.zygote_pays(4, 1) is True
    assert probe_workspace.zygote_pays(2, 6, listed=True) is True  # a recorded list pays from the first round


def _verdicts(output: str) -> list[str]:
    """The lines of `probe check` that say what the probe said, their durations aside."""
    return [line.split(" in ")[0] for line in output.splitlines() if line.startswith(("kv.yaml on", "ok:", "coverage:"))]
