"""Move the pin (`vpatch update`): decide each patch's disposition, apply the carried patches on the new pin,
commit once.

disposition.py decides what happens to each patch (status shows the same rows); run.py carries it out in an
update tree; journal.py keeps the state that makes a stop or a kill resumable; commit.py builds and moves the
project commit.
"""

from vpatch.base import ExitCode, VpatchError
from vpatch.update.disposition import Dispositions, dispose_status, disposition_of, judge_with_status
from vpatch.update.furthest import Blocker, Choice, Reach
from vpatch.update.guard import Refused
from vpatch.update.journal import Stopped, stopped_update
from vpatch.update.plan import (
    Action,
    PatchPlan,
    Result,
    Revalidation,
    Stop,
    UpdateOutcome,
    UpdatePlan,
    Validator,
    commit_message,
)
from vpatch.update.run import abort, resume, update, update_furthest, validate_with_probes

__all__ = [
    "Action",
    "Blocker",
    "Choice",
    "Dispositions",
    "ExitCode",
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
    "dispose_status",
    "disposition_of",
    "judge_with_status",
    "resume",
    "stopped_update",
    "update",
    "update_furthest",
    "validate_with_probes",
]
