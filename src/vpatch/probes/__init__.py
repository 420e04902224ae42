"""Probes: a patch's behavioural or file evidence, loaded, run on a tree or in an image with one interpreter
of its answer, cached, validated on both sides of the patch; the venv probes run in.

Other rooms import these names from here; modules inside the room import each other directly."""

from vpatch.probes.file import Probe, probe_for
from vpatch.probes.outcome import Place, ProbeKind, ProbeOutcome, Ran, argv, interpret

__all__ = [
    "Place",
    "Probe",
    "ProbeKind",
    "ProbeOutcome",
    "Ran",
    "argv",
    "interpret",
    "probe_for",
]
