"""Verdicts for every patch on every target, and where a landed patch landed.

Other rooms import these names from here; modules inside the room import each other directly."""

from vpatch.status.compute import Landing, PatchStatus, Status

__all__ = [
    "Landing",
    "PatchStatus",
    "Status",
]
