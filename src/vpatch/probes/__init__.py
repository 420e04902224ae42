"""Probes: a patch's behavioural or file evidence, loaded, run on a tree or in an image with one interpreter
of its answer, cached, validated on both sides of the patch; the venv probes run in.

`Witness` is the room's door: what patch P's evidence says on commit C, asked in one place (witness.py).
Other rooms import these names from here; modules inside the room import each other directly."""

from vpatch.probes.check import Checked, ProbeTarget, check_probe, find_patch, probe_name, probe_target, write_probe_template
from vpatch.probes.coverage import Coverage, HunkCoverage, hunk_coverage
from vpatch.probes.env import LOCK_NAME, LockChange, refresh_lock
from vpatch.probes.file import Probe, probe_for
from vpatch.probes.follow import Followed, FollowedStrings, Moved, follow_strings, rename_key
from vpatch.probes.outcome import Place, ProbeKind, ProbeOutcome, Ran, argv, interpret
from vpatch.probes.prepare import venvs_beside
from vpatch.probes.regression import RegressionError, Regressions, TestRun, runs_tests
from vpatch.probes.runner import Validation
from vpatch.probes.witness import ProbeCheck, ProbeFn, Tally, Witness, stacked_tree
from vpatch.probes.workspace import default_jobs, listed, zygote_pays

__all__ = [
    "LOCK_NAME",
    "Checked",
    "Coverage",
    "Followed",
    "FollowedStrings",
    "HunkCoverage",
    "LockChange",
    "Moved",
    "Place",
    "Probe",
    "ProbeCheck",
    "ProbeFn",
    "ProbeKind",
    "ProbeOutcome",
    "ProbeTarget",
    "Ran",
    "RegressionError",
    "Regressions",
    "Tally",
    "TestRun",
    "Validation",
    "Witness",
    "argv",
    "check_probe",
    "default_jobs",
    "find_patch",
    "follow_strings",
    "hunk_coverage",
    "interpret",
    "listed",
    "probe_for",
    "probe_name",
    "probe_target",
    "refresh_lock",
    "rename_key",
    "runs_tests",
    "stacked_tree",
    "venvs_beside",
    "write_probe_template",
    "zygote_pays",
]
