"""Verdicts for every patch and target, and where a landed patch landed.

Other rooms import these names from here; modules inside the room import each other directly."""

from vpatch.status.compute import Landing, PatchStatus, Status, Target, compute_status, newest_release, resolve_targets
from vpatch.status.landing import bisect_first, search_landing

__all__ = [
    "Landing",
    "PatchStatus",
    "Status",
    "Target",
    "bisect_first",
    "compute_status",
    "newest_release",
    "resolve_targets",
    "search_landing",
]
