"""Probes on small real repositories: each kind, each outcome, the result cache, validation, bad files."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import KV_FIXED, Project, ToyUpstream
from helpers.probefiles import COMMAND_PROBE, SCRIPT, project_patch, write_probe

from vpatch.base.paths import cache_dir
from vpatch.probes import runner as probes
from vpatch.probes.file import Probe, ProbeError
from vpatch.probes.runner import ProbeOutcome

FILES_PROBE = """\
kind: files
files:
  vllm/kv.py:
    contains: ["continue"]
    not_contains: ["break"]
"""


def runs(folder: Path) -> int:
    log = folder / "runs.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_files_probe_reads_the_tree_without_a_checkout(toy_upstream: ToyUpstream, fixed: str, tmp_path: Path) -> None:
    probe = write_probe(tmp_path / "probes", FILES_PROBE)
    assert probes.run_probe(toy_upstream.path, probe, "v1.1").outcome is ProbeOutcome.PASS
    failed = probes.run_probe(toy_upstream.path, probe, "v1.0")
    assert failed.outcome is ProbeOutcome.FAIL
    assert "vllm/kv.py: lacks 'continue'" in failed.detail and "still has 'break'" in failed.detail
    # The probe read git's objects: the checkout of the upstream still holds v1.1.
    assert (toy_upstream.path / "vllm/kv.py").read_text() == KV_FIXED


def test_a_missing_file_is_never_evidence_unless_the_probe_says_absence_is_the_fix(
        toy_upstream: ToyUpstream, tmp_path: Path) -> None:
    gone = write_probe(tmp_path / "a", "kind: files\nfiles:\n  vllm/gone.py:\n    not_contains: [x]\n")
    needed = write_probe(tmp_path / "b", "kind: files\nfiles:\n  vllm/gone.py:\n    contains: [x]\n")
    for probe in (gone, needed):
        result = probes.run_probe(toy_upstream.path, probe, "v1.0")
        assert result.outcome is ProbeOutcome.ERROR, result  # neither a pass (vacuous) nor a fail
        assert "vllm/gone.py: missing from the tree; a missing file is no evidence" in result.detail
    said = write_probe(tmp_path / "c", "kind: files\nfiles:\n  vllm/gone.py:\n    absent_is_fix: true\n")
    result = probes.run_probe(toy_upstream.path, said, "v1.0")
    assert result.outcome is ProbeOutcome.PASS and "absent, which the probe says is the fix" in result.detail
    present = write_probe(tmp_path / "d", "kind: files\nfiles:\n  vllm/kv.py:\n    absent_is_fix: true\n")
    result = probes.run_probe(toy_upstream.path, present, "v1.0")
    assert (result.outcome, result.detail) == (ProbeOutcome.FAIL, "vllm/kv.py: still there")


def test_a_file_check_that_checks_nothing_or_a_bad_absent_is_fix_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ProbeError, match=r"vllm/x\.py: checks nothing"):
        write_probe(tmp_path / "a", "kind: files\nfiles:\n  vllm/x.py:\n    contains: []\n")
    with pytest.raises(ProbeError, match="absent_is_fix: must be true or false"):
        write_probe(tmp_path / "b", "kind: files\nfiles:\n  vllm/x.py:\n    absent_is_fix: 'yes'\n")


def test_command_probe_runs_in_the_materialised_tree(toy_upstream: ToyUpstream, fixed: str, tmp_path: Path) -> None:
    folder = tmp_path / "probes"
    probe = write_probe(folder, COMMAND_PROBE, SCRIPT)
    passed = probes.run_probe(toy_upstream.path, probe, "v1.1")
    failed = probes.run_probe(toy_upstream.path, probe, "v1.0")
    assert (passed.outcome, failed.outcome) == (ProbeOutcome.PASS, ProbeOutcome.FAIL)
    assert passed.detail == "kv.py says continue" and failed.detail == "kv.py says break"
    assert runs(folder) == 2


def test_command_probe_runs_against_a_bare_tree_id(toy_upstream: ToyUpstream, fixed: str, tmp_path: Path) -> None:
    probe = write_probe(tmp_path / "probes", COMMAND_PROBE, SCRIPT)
    tree = probes.git.tree_of(toy_upstream.path, "v1.1")
    result = probes.run_probe(toy_upstream.path, probe, tree)
    assert (result.outcome, result.tree) == (ProbeOutcome.PASS, tree)


@pytest.mark.parametrize(
    ("script", "timeout", "says"),
    [
        ("import sys\nsys.exit(3)\n", 60, "exit code 3"),
        ("import torch_that_is_not_there\n", 60, "the probe crashed"),
        ("import time\ntime.sleep(30)\n", 1, "timed out after 1s"),
    ],
    ids=["other-exit-code", "crash", "timeout"],
)
def test_anything_but_exit_0_or_1_is_an_error_and_never_cached(
    toy_upstream: ToyUpstream, tmp_path: Path, script: str, timeout: int, says: str
) -> None:
    folder = tmp_path / "probes"
    probe = write_probe(folder, COMMAND_PROBE.replace("timeout: 60", f"timeout: {timeout}"),
                        "import pathlib\npathlib.Path(__file__).with_name('runs.log').open('a').write('run\\n')\n"
                        + script)
    first = probes.run_probe(toy_upstream.path, probe, "v1.0")
    assert first.outcome is ProbeOutcome.ERROR and says in first.detail
    assert probes.run_probe(toy_upstream.path, probe, "v1.0").cached is False
    assert runs(folder) == 2


def test_second_run_is_answered_from_the_cache(toy_upstream: ToyUpstream, fixed: str, tmp_path: Path) -> None:
    folder = tmp_path / "probes"
    probe = write_probe(folder, COMMAND_PROBE, SCRIPT)
    first = probes.run_probe(toy_upstream.path, probe, "v1.0")
    again = Probe.load(folder / "probe.yaml")
    second = probes.run_probe(toy_upstream.path, again, "v1.0")
    assert (first.cached, second.cached) == (False, True)
    assert (second.outcome, second.detail) == (first.outcome, first.detail)
    assert runs(folder) == 1
    entries = list((cache_dir() / "probe-results").rglob("*.json"))
    assert [e.name for e in entries] == [f"{second.tree}.json"]


def test_changing_the_script_invalidates_the_cache(toy_upstream: ToyUpstream, fixed: str, tmp_path: Path) -> None:
    folder = tmp_path / "probes"
    probe = write_probe(folder, COMMAND_PROBE, SCRIPT)
    assert probes.run_probe(toy_upstream.path, probe, "v1.1").outcome is ProbeOutcome.PASS
    (folder / "check.py").write_text(SCRIPT.replace('"continue" in text else 1', '"nothing" in text else 1'))
    rerun = probes.run_probe(toy_upstream.path, Probe.load(folder / "probe.yaml"), "v1.1")
    assert (rerun.outcome, rerun.cached) == (ProbeOutcome.FAIL, False)
    assert runs(folder) == 2


def test_validate_accepts_a_probe_that_fails_on_the_pin_and_passes_with_the_patch(
    project: Project, tmp_path: Path
) -> None:
    patch = project_patch(project, COMMAND_PROBE, SCRIPT)
    validation = probes.validate_probe(project.upstream.path, None, patch, base="v1.0")
    assert validation.ok
    assert (validation.base.outcome, validation.patched.outcome) == (ProbeOutcome.FAIL, ProbeOutcome.PASS)
    assert validation.patched.detail == "kv.py says continue"


def test_validate_refuses_a_probe_that_passes_everywhere(project: Project) -> None:
    patch = project_patch(project, "kind: files\nfiles:\n  vllm/kv.py:\n    contains: [release]\n")
    with pytest.raises(ProbeError) as caught:
        probes.validate_probe(project.upstream.path, None, patch, base="v1.0")
    assert "does not discriminate" in caught.value.message and "passes on v1.0" in caught.value.message
    assert caught.value.hint and "would drop a needed patch" in caught.value.hint


def test_validate_refuses_a_probe_that_still_fails_with_the_patch(project: Project) -> None:
    patch = project_patch(project, "kind: files\nfiles:\n  vllm/kv.py:\n    contains: [never-there]\n")
    with pytest.raises(ProbeError, match=r"fails on v1\.0 without the patch and fails with it"):
        probes.validate_probe(project.upstream.path, None, patch, base="v1.0")


def test_validate_refuses_a_probe_that_cannot_decide(project: Project) -> None:
    patch = project_patch(project, COMMAND_PROBE, "import sys\nprint('cannot import torch')\nsys.exit(2)\n")
    with pytest.raises(ProbeError) as caught:
        probes.validate_probe(project.upstream.path, None, patch, base="v1.0")
    assert "errors on v1.0" in caught.value.message
    assert caught.value.hint == "the probe could not decide: cannot import torch"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("kind: file\n", "kind: must be 'files' or 'command', not 'file'"),
        ("- kind: files\n", "a probe is a mapping"),
        ("kind: files\nfiles: {a.py: {contains: [x]}}\nrun: [x]\n", "run: not a key of a 'files' probe"),
        ("kind: files\nfiles: {a.py: {contain: [x]}}\n", "files: a.py: contain: not a file check"),
        ("kind: files\nfiles: {a.py: {contains: x}}\n", "files: a.py: contains: must be a list"),
        ("kind: files\nfiles: {}\n", "files: must map tree paths"),
        ("kind: command\nrun: []\n", "run: must not be empty"),
        ("kind: command\nrun: ['{pyhton}']\n", "run: unknown placeholder {pyhton}"),
        ("kind: command\nrun: [x]\ntimeout: -1\n", "timeout: must be a positive number"),
        ("kind: command\nrun: [x]\nrequirement: [torch]\n", "requirement: not a key of a 'command' probe"),
        ("kind: [", "not valid YAML"),
    ],
)
def test_a_bad_probe_file_names_the_file_and_the_key(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "0007-x.yaml"
    path.write_text(text)
    with pytest.raises(ProbeError) as caught:
        Probe.load(path)
    assert caught.value.message.startswith(f"{path}: ")
    assert says in caught.value.message


def test_a_missing_probe_file_says_where_the_trailer_points(tmp_path: Path) -> None:
    with pytest.raises(ProbeError) as caught:
        Probe.load(tmp_path / "probes" / "nope.yaml")
    assert "nope.yaml" in caught.value.message and "relative to the patches folder" in (caught.value.hint or "")
