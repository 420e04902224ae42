"""Send a needed patch upstream (`vpatch forward`): carried onto REF as update would carry it, with a test in
upstream's layout that fails without it and passes with it, as one commit, its mail form and a PR body; and
record where it went, so that status shows it and its landing by PR number drops it.

carry.py is the one seam to the update's decision; testfile.py the patch's own upstream test; message.py the
commit message and PR body; send.py the flow; record.py the header's Forwarded:/Upstream-PR: lines."""

from vpatch.forward.carry import Carry, LeftOut, Way, carry_at
from vpatch.forward.message import Measured
from vpatch.forward.record import Recorded, record_forwarded
from vpatch.forward.send import ForwardStop, Submission, branch_name, continue_forward, forward_patch
from vpatch.forward.testfile import UpstreamTest

__all__ = [
    "Carry",
    "ForwardStop",
    "LeftOut",
    "Measured",
    "Recorded",
    "Submission",
    "UpstreamTest",
    "Way",
    "branch_name",
    "carry_at",
    "continue_forward",
    "forward_patch",
    "record_forwarded",
]
