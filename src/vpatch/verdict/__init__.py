"""One patch on one tree: what its diff says there (evidence), the verdict (landed / needed / partial /
conflict) and the case a patch is in there.

Other rooms import these names from here; modules inside the room import each other directly."""

from vpatch.verdict.applycheck import ApplyOutcome
from vpatch.verdict.applycheck import check as apply_check
from vpatch.verdict.case import Case, Finding, classify
from vpatch.verdict.judge import Evidence, Kind, Says, State, Verdict, judge_series
from vpatch.verdict.textual import Applies, hunk_name

__all__ = [
    "Applies",
    "ApplyOutcome",
    "Case",
    "Evidence",
    "Finding",
    "Kind",
    "Says",
    "State",
    "Verdict",
    "apply_check",
    "classify",
    "hunk_name",
    "judge_series",
]
