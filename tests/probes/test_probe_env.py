"""The probe venv: one lock file of exact pins, part of the venv key and of every cached verdict;
a broken venv replaced once; timeouts end the whole probe; what killed runs left is removed."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import KV_FIXED, Project, ToyUpstream
from helpers.probefiles import COMMAND_PROBE, SCRIPT, project_patch, write_probe
from helpers.project import commit_all, release

from vpatch.base.progress import Event
from vpatch.probes import env as probe_env
from vpatch.probes import runner as probes
from vpatch.probes.env import EnvError, Requirements
from vpatch.probes.file import Probe
from vpatch.probes.runner import ProbeOutcome

ROOT = Path(__file__).resolve().parents[2]


def make_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    """A real, installable pure-Python wheel whose module says its version."""
    folder.mkdir(parents=True, exist_ok=True)
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                            + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: vpatch-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as whl:
        for path, text in files.items():
            whl.writestr(path, text)


@pytest.fixture
def wheels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """pip sees only a local folder of wheels: no index, no config file, no network."""
    folder = tmp_path / "wheels"
    make_wheel(folder, "tinypkg", "1.0")
    make_wheel(folder, "tinypkg", "1.1", ("tinydep",))
    make_wheel(folder, "tinydep", "2.0", ("hugepkg",))
    make_wheel(folder, "hugepkg", "9.0")
    for var in list(os.environ):
        if var.startswith("PIP_"):
            monkeypatch.delenv(var)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    return folder


LOCKED_PROBE = """\
kind: command
run: ["{python}", "{probe_dir}/check.py"]
lock: requirements.lock
timeout: 120
"""

# PASS when the tree skips null blocks; says which tinypkg the venv holds.
VERSION_SCRIPT = """\
import pathlib, sys, tinypkg
print("tinypkg", tinypkg.VERSION)
sys.exit(0 if "continue" in pathlib.Path("vllm/kv.py").read_text() else 1)
"""


def test_the_lock_is_in_the_venv_key_and_the_verdict_key(
    toy_upstream: ToyUpstream, fixed: str, wheels: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "probes"
    (folder).mkdir()
    (folder / "requirements.lock").write_text("# a comment\ntinypkg==1.0\n")
    probe = write_probe(folder, LOCKED_PROBE, VERSION_SCRIPT)

    first = probes.run_probe(toy_upstream.path, probe, "v1.1")
    again = probes.run_probe(toy_upstream.path, Probe.load(folder / "probe.yaml"), "v1.1")
    (folder / "requirements.lock").write_text("# a comment\ntinypkg==1.1\ntinydep==2.0\nhugepkg==9.0\n")
    relocked = probes.run_probe(toy_upstream.path, Probe.load(folder / "probe.yaml"), "v1.1")

    assert (first.outcome, first.cached) == (ProbeOutcome.PASS, False) and "tinypkg 1.0" in first.detail
    assert again.cached
    assert (relocked.outcome, relocked.cached) == (ProbeOutcome.PASS, False) and "tinypkg 1.1" in relocked.detail
    venvs = [p.name for p in probe_env.venv_root().iterdir() if not p.name.startswith(".")]
    assert len(venvs) == 2


def test_a_lock_holds_exact_pins_only(tmp_path: Path) -> None:
    lock = tmp_path / "requirements.lock"
    lock.write_text("tinypkg==1.0\nnumpy>=2\n")

    with pytest.raises(EnvError, match=r"requirements.lock:2: 'numpy>=2' is not an exact pin"):
        Requirements.from_lock(lock)


def test_the_shipped_behavioural_probes_share_one_lock_and_one_venv() -> None:
    found = [Probe.load(p) for p in sorted((ROOT / "patches" / "probes").glob("*.yaml"))]
    commands = [p for p in found if p.kind is probes.ProbeKind.COMMAND]

    assert [p.name for p in commands] == ["0002-mamba-null-gap-free.yaml", "0003-qwen3-tool-call-unclosed-function.yaml"]
    assert {p.lock for p in commands} == {ROOT / "patches" / "probes" / "requirements.lock"}
    assert len({p.environment().key() for p in commands}) == 1
    pins = commands[0].environment().lines
    assert "torch==2.13.0+cpu" in pins and not any(p.startswith("triton==") for p in pins)


def test_a_venv_missing_its_python_is_replaced_once(tmp_path: Path) -> None:
    empty = Requirements.inline([])
    python = probe_env.probe_venv(empty, cache=tmp_path)
    python.unlink()  # a half-deleted venv, or one whose interpreter went away

    again = probe_env.probe_venv(empty, cache=tmp_path)
    built = (again.parent.parent / "pyvenv.cfg").stat().st_mtime_ns
    third = probe_env.probe_venv(empty, cache=tmp_path)

    assert again == third == python and python.exists()
    assert (python.parent.parent / "pyvenv.cfg").stat().st_mtime_ns == built  # not rebuilt a second time
    assert sorted(p.name for p in probe_env.venv_root(tmp_path).iterdir()) == [".lock", empty.key()]


def test_what_a_killed_venv_build_left_is_removed_by_the_next_build(tmp_path: Path) -> None:
    leftover = probe_env.venv_root(tmp_path) / ".0123456789abcdef0123-x1y2z3"
    (leftover / ".pip-tmp" / "pip-build-abc").mkdir(parents=True)

    probe_env.probe_venv(Requirements.inline([]), cache=tmp_path)

    assert not leftover.exists()


def test_building_the_venv_reports_one_event_per_phase(wheels: Path, tmp_path: Path) -> None:
    lock = tmp_path / "requirements.lock"
    lock.write_text("tinypkg==1.0\n")
    seen: list[Event] = []

    probe_env.probe_venv(Requirements.from_lock(lock), cache=tmp_path / "cache", report=seen.append)

    assert [e.step for e in seen] == ["creating the venv", "installing 1 pinned packages", "ready"]
    assert {e.subject for e in seen} == {"probe venv"} and seen[-1].final and seen[-1].seconds is not None


def test_uv_installs_the_lock_from_where_pip_s_config_file_looks(wheels: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """uv reads none of pip's configuration: a find-links folder named only in pip's config file (no PIP_*
    variable) is still where the pins come from, and uv (the declared dependency) is what installed them."""
    monkeypatch.delenv("PIP_FIND_LINKS")
    monkeypatch.delenv("PIP_NO_INDEX")
    config = tmp_path / "pip.conf"
    config.write_text(f"[global]\nno-index = true\n[install]\nfind-links = {tmp_path / 'nowhere'}\n  {wheels}\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    lock = tmp_path / "requirements.lock"
    lock.write_text("tinypkg==1.1\n")  # its tinydep is not installed: no resolver

    python = probe_env.probe_venv(Requirements.from_lock(lock), cache=tmp_path / "cache")
    # compiled as installed (read before anything imports it, which would write it): a run never writes bytecode
    # (PYTHONDONTWRITEBYTECODE), so without it every import of the venv compiles its source again
    compiled = list(python.parent.parent.glob("lib/python*/site-packages/tinypkg/__pycache__/__init__.*.pyc"))

    site = subprocess.run([python, "-c", "import tinypkg, importlib.metadata as m; print(tinypkg.VERSION, "
                           "m.distribution('tinypkg').read_text('INSTALLER').strip(), "
                           "[d.metadata['Name'] for d in m.distributions() if d.metadata['Name'].startswith('tiny')])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert site == "1.1 uv ['tinypkg']"
    assert compiled and (python.parent.parent / probe_env.BYTECODE_FILE).exists()


def test_a_venv_an_older_vpatch_built_without_bytecode_is_compiled_once(wheels: Path, tmp_path: Path) -> None:
    lock = tmp_path / "requirements.lock"
    lock.write_text("tinypkg==1.0\n")
    python = probe_env.probe_venv(Requirements.from_lock(lock), cache=tmp_path / "cache")
    venv = python.parent.parent
    for cache in venv.glob("lib/python*/site-packages/**/__pycache__"):
        shutil.rmtree(cache)
    (venv / probe_env.BYTECODE_FILE).unlink()  # as an older vpatch's uv install left it
    seen: list[Event] = []

    again = probe_env.probe_venv(Requirements.from_lock(lock), cache=tmp_path / "cache", report=seen.append)
    third: list[Event] = []
    probe_env.probe_venv(Requirements.from_lock(lock), cache=tmp_path / "cache", report=third.append)

    assert again == python
    assert [e.step for e in seen] == ["byte-compiling", "byte-compiled"] and not third
    assert list(venv.glob("lib/python*/site-packages/tinypkg/__pycache__/__init__.*.pyc"))


@pytest.mark.parametrize("constrained", [False, True], ids=["plain", "constraint-file"])
def test_a_cpu_torch_pip_cannot_see_is_named_with_where_to_get_it(
        wheels: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, constrained: bool) -> None:
    """The shipped lock pins torch==2.13.0+cpu, which PyPI does not carry: on a machine whose pip knows only PyPI
    the build fails, and pip's own words are "No matching distribution" or, with a constraint file that names
    torch (as this machine's pip configuration has), "conflicting dependencies". The error names the pin and
    the two ways to let pip see it. A pin that is missing for any other reason keeps pip's words."""
    if constrained:
        (tmp_path / "constraints.txt").write_text("torch<=2.14.1\n")
        monkeypatch.setenv("PIP_CONSTRAINT", str(tmp_path / "constraints.txt"))
    lock = tmp_path / "requirements.lock"
    lock.write_text("tinypkg==1.0\ntorch==2.13.0+cpu\n")
    with pytest.raises(EnvError) as caught:
        probe_env.probe_venv(Requirements.from_lock(lock), cache=tmp_path / "cache")
    assert caught.value.message == ("no wheel of torch==2.13.0+cpu where pip looks, the CPU build of PyTorch the probe "
                                    "lock pins (PyPI does not carry it)")
    assert "PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu" in (caught.value.hint or "")
    assert "PIP_FIND_LINKS" in (caught.value.hint or "")
    lock.write_text("tinypkg==3.0\n")
    with pytest.raises(EnvError) as other:
        probe_env.probe_venv(Requirements.from_lock(lock), cache=tmp_path / "cache")
    assert "tinypkg==3.0" in other.value.message and "PyTorch" not in other.value.message


def test_refreshing_the_lock_resolves_requires_and_leaves_out_omit(wheels: Path, tmp_path: Path) -> None:
    lock = tmp_path / "requirements.lock"
    lock.write_text("# header kept\n# requires: tinypkg\n# omit: hugepkg\ntinypkg==1.0\n")

    change = probe_env.refresh_lock(lock)

    assert lock.read_text() == "# header kept\n# requires: tinypkg\n# omit: hugepkg\ntinydep==2.0\ntinypkg==1.1\n"
    assert (change.added, change.removed, change.moved) == (("tinydep==2.0",), (), (("tinypkg", "1.0", "1.1"),))


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


GRANDCHILD_SCRIPT = """\
import pathlib, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
pathlib.Path(sys.argv[1]).write_text(str(child.pid))
time.sleep(300)
"""


def test_a_probe_timeout_ends_everything_the_probe_started(
    toy_upstream: ToyUpstream, tmp_path: Path
) -> None:
    folder = tmp_path / "probes"
    pid_file = tmp_path / "grandchild.pid"
    probe = write_probe(folder, f'kind: command\nrun: ["{{python}}", "{{probe_dir}}/check.py", "{pid_file}"]\n'
                                "timeout: 5\n", GRANDCHILD_SCRIPT)

    result = probes.run_probe(toy_upstream.path, probe, "v1.0")

    grandchild = int(pid_file.read_text())
    try:
        assert result.outcome is ProbeOutcome.ERROR and "timed out after 5s" in result.detail
        assert _state(grandchild) in ("gone", "Z")  # killed (a zombie until something reaps it)
    finally:
        if _state(grandchild) not in ("gone", "Z"):
            os.kill(grandchild, 9)


def test_a_killed_probe_run_s_tree_is_removed_by_the_next_run(
    toy_upstream: ToyUpstream, fixed: str, tmp_path: Path
) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    runs = tmp_path / "cache" / "probe-runs"
    stale = runs / f"run-{dead.stdout.strip()}-abcd"
    (stale / "tree" / "vllm").mkdir(parents=True)
    live = runs / f"run-{os.getpid()}-efgh"  # a run of a process still alive stays
    live.mkdir()
    probe = write_probe(tmp_path / "probes", "kind: command\nrun: [\"{python}\", \"-c\", \"pass\"]\n")

    assert probes.run_probe(toy_upstream.path, probe, "v1.1", cache=tmp_path / "cache").outcome is ProbeOutcome.PASS

    assert sorted(p.name for p in runs.iterdir()) == [live.name]


def test_status_shows_each_probe_on_stderr_and_keeps_json_on_stdout_clean(project: Project) -> None:
    import json

    from typer.testing import CliRunner

    from vpatch.commands.cli import app

    project_patch(project, COMMAND_PROBE, SCRIPT)

    result = CliRunner().invoke(app, ["--project", str(project.root), "status", "--json"])

    assert result.exit_code == 0, result.output
    json.loads(result.stdout)  # nothing but the document
    lines = result.stderr.splitlines()
    assert "probe venv: creating the venv" in result.stderr and any(line.startswith("probe venv: ready") for line in lines)
    assert "probe 0001-kv-skip-null on v1.0: running" in lines
    # its tree first (extracted before the run takes its place, and said, as it may take seconds), then the run
    assert lines.index("probe 0001-kv-skip-null on v1.0: getting its tree") < \
        lines.index("probe 0001-kv-skip-null on v1.0: running")
    assert any(line.startswith("probe 0001-kv-skip-null on v1.0: fail (") for line in lines)


def test_lock_probes_command_rewrites_the_lock_and_says_what_moved(wheels: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from vpatch.commands.cli import app

    lock = tmp_path / "requirements.lock"
    lock.write_text("# requires: tinypkg==1.1\n# omit: hugepkg\ntinypkg==1.0\n")

    result = CliRunner().invoke(app, ["--project", str(tmp_path), "lock-probes", "--lock", str(lock)])
    again = CliRunner().invoke(app, ["--project", str(tmp_path), "lock-probes", "--lock", str(lock)])

    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["tinypkg 1.0 -> 1.1", "+ tinydep==2.0"]
    assert again.stdout == "" and "requirements.lock: unchanged" in again.stderr


def test_update_shows_each_probe_it_runs_on_stderr(project: Project) -> None:
    import json

    from typer.testing import CliRunner

    from vpatch.commands.cli import app

    project_patch(project, COMMAND_PROBE, SCRIPT)
    commit_all(project)
    # v1.1 has the fix and another change, so the pin + the patch is a tree of its own.
    release(project, {"vllm/kv.py": KV_FIXED, "README": "toy vllm 1.1\n"}, "v1.1")

    result = CliRunner().invoke(app, ["--project", str(project.root), "update", "--to", "v1.1", "--json"])

    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["outcome"]
    lines = result.stderr.splitlines()
    # The verdicts on the pin and the target, and once the probe on the pin plus the patch (status's validation
    # of the probe, named by its tree); the drop's re-validation then finds both answers in the cache.
    assert any(line.startswith("probe 0001-kv-skip-null on v1.0: fail (") for line in lines)
    assert any(line.startswith("probe 0001-kv-skip-null on v1.1: pass (") for line in lines)
    with_patch = [line for line in lines if line.startswith("probe 0001-kv-skip-null on ") and ": pass (" in line
                  and " on v1." not in line]
    assert len(with_patch) == 1, "\n".join(lines)


def test_the_series_probe_venv_builds_beside_other_work_and_is_ready_after_it(
        project: Project, wheels: Path, tmp_path: Path) -> None:
    """`vpatch releases` in a project builds its probe venv while the sdists download: the block runs at once
    (it does not wait for the venv), and the venv is there when it ends, so the next probe builds nothing."""
    from vpatch.probes import venvs_beside
    from vpatch.series import Series

    project_patch(project, LOCKED_PROBE, VERSION_SCRIPT)
    (project.patches / "probes" / "requirements.lock").write_text("tinypkg==1.0\n")
    patches = Series.load(project.patches).patches
    seen: list[Event] = []

    with venvs_beside(patches, cache=tmp_path / "cache", report=seen.append):
        inside = [e.step for e in seen if e.final]  # the block's own work runs while the venv builds
    after = [e.step for e in seen if e.final]
    again: list[Event] = []
    probe_env.probe_venv(Requirements.from_lock(project.patches / "probes" / "requirements.lock"),
                         cache=tmp_path / "cache", report=again.append)

    assert inside == [] and after == ["ready"]
    assert again == []  # built already: nothing to do


def test_a_series_whose_probe_venv_cannot_be_built_does_not_fail_the_work_beside_it(
        project: Project, wheels: Path, tmp_path: Path) -> None:
    from vpatch.probes import venvs_beside
    from vpatch.series import Series

    project_patch(project, LOCKED_PROBE, VERSION_SCRIPT)
    (project.patches / "probes" / "requirements.lock").write_text("tinypkg==7.0\n")  # no such wheel
    seen: list[Event] = []

    with venvs_beside(Series.load(project.patches).patches, cache=tmp_path / "cache", report=seen.append):
        pass

    assert [(e.subject, e.step) for e in seen if e.final] == [("probe venv", "failed")]
