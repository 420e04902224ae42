"""How the CLI shows progress events on stderr: a live rich display on a terminal, plain lines otherwise.

Only the CLI creates a view; core code just calls the reporter it is given. Nothing goes to stdout,
so `--json` output stays clean.
"""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING, Self, TextIO

from vpatch.base import Event

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

# Plain mode: a transfer's running total at most this often per subject (lines go to CI logs).
_PLAIN_EVERY_S = 5.0


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def describe(event: Event) -> str:
    """One event as one line of text, without the live parts."""
    text = f"{event.subject}: {event.step}"
    if event.done is not None and not event.final:
        text += f" {_size(event.done)}" + (f" of {_size(event.total)}" if event.total else "")
    if event.detail:
        text += f" {event.detail}"
    if event.seconds is not None:
        text += f" ({event.seconds:.1f}s)"
    return text


class ProgressView:
    """A reporter (call it with events) that draws on stderr for the length of a `with` block."""

    def __init__(self, stream: TextIO | None = None, *, live: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self._lock = threading.Lock()
        self._last: dict[str, tuple[str, float]] = {}  # subject -> (step, when last shown)
        self._progress: Progress | None = None
        self._tasks: dict[str, TaskID] = {}

    def __enter__(self) -> Self:
        if self.live:
            from rich.console import Console  # lazy: rich loads only when something is shown; --help shows no table
            from rich.progress import (  # lazy: rich loads only when something is shown; --help shows no table
                BarColumn,
                DownloadColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                      DownloadColumn(), TimeElapsedColumn(),
                                      console=Console(file=self.stream), transient=True)
            self._progress.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def __call__(self, event: Event) -> None:
        with self._lock:
            if self._progress is not None:
                self._live(self._progress, event)
            else:
                self._plain(event)

    def _plain(self, event: Event) -> None:
        now = time.monotonic()
        step, shown = self._last.get(event.subject, ("", 0.0))
        # A new step or the end is always news; a running byte count only now and then.
        if event.final or step != event.step or now - shown >= _PLAIN_EVERY_S:
            print(describe(event), file=self.stream, flush=True)
            self._last[event.subject] = (event.step, now)
        if event.final:
            self._last.pop(event.subject, None)

    def _live(self, progress: Progress, event: Event) -> None:
        task = self._tasks.get(event.subject)
        label = f"{event.subject}: {event.step}" + (f" {event.detail}" if event.detail and event.done is None else "")
        if task is None:
            task = self._tasks[event.subject] = progress.add_task(label, total=event.total, start=True)
        progress.update(task, description=label, completed=event.done or 0, total=event.total)
        if event.final:
            progress.remove_task(task)
            del self._tasks[event.subject]
            progress.console.print(describe(event), highlight=False)
