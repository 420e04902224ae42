"""Move the pin (`vpatch update`): plan the move, apply the kept patches on the new pin, commit once.

plan.py decides what happens to each patch; run.py does the work in an update tree; journal.py keeps
the state that makes a stop or a kill resumable; commit.py builds and moves the project commit.
"""

from vpatch.base import ExitCode, VpatchError
from vpatch.update.furthest import Blocker, Choice, Reach
from vpatch.update.guard import Refused
from vpatch.update.journal import Stopped, stopped_update
from vpatch.update.plan import (
    FileAction,
    PatchPlan,
    Result,
    Revalidation,
    Stop,
    UpdateOutcome,
    UpdatePlan,
    Validator,
    commit_message,
    judge_with_status,
)
from vpatch.update.run import abort, resume, update, update_furthest, validate_with_probes

__all__ = [
    "Blocker",
    "Choice",
    "ExitCode",
    "FileAction",
    "PatchPlan",
    "Reach",
    "Refused",
    "Result",
    "Revalidation",
    "Stop",
    "Stopped",
    "UpdateOutcome",
    "UpdatePlan",
    "Validator",
    "VpatchError",
    "abort",
    "commit_message",
    "judge_with_status",
    "resume",
    "stopped_update",
    "update",
    "update_furthest",
    "validate_with_probes",
]
