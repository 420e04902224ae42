"""Progress events: core code reports what it is doing through a callback; only the CLI shows them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Event:
    """One step of one piece of work; events with the same `subject` are about the same thing."""

    subject: str  # what progresses: "vllm 0.30.0", "probe venv", "probe 0002 on v0.30.0"
    step: str  # where it is: "downloading", "installing torch", "pass"
    detail: str = ""
    done: int | None = None  # bytes so far, for transfers
    total: int | None = None  # bytes in all, when known
    final: bool = False  # the subject's last event: it finished (well or not)
    seconds: float | None = None  # how long the subject took, on its final event


Reporter = Callable[[Event], None]


def silent(_: Event) -> None:
    """The reporter of code run without a CLI: drops every event."""


# The plain-text sibling of Reporter: one line per step, for work that has no byte counts to show
# (docker builds and runs, serve's lint, deploy's checks).
Progress = Callable[[str], None]
