"""One patch on one tree: what its diff says there (evidence), the verdict (landed / needed / partial /
conflict) and the one decision from a verdict to what an update does.

Other rooms import these names from here; modules inside the room import each other directly."""

from vpatch.verdict.applycheck import ApplyOutcome
from vpatch.verdict.applycheck import check as apply_check
from vpatch.verdict.decision import Action, Case, Decision, decide, verb, vetoed, worst
from vpatch.verdict.judge import FOLLOWED_CODE, Evidence, Kind, Says, State, Verdict, judge_series
from vpatch.verdict.textual import Applies, hunk_name

__all__ = [
    "FOLLOWED_CODE",
    "Action",
    "Applies",
    "ApplyOutcome",
    "Case",
    "Decision",
    "Evidence",
    "Kind",
    "Says",
    "State",
    "Verdict",
    "apply_check",
    "decide",
    "hunk_name",
    "judge_series",
    "verb",
    "vetoed",
    "worst",
]
