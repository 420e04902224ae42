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
# A view that asked for it ends with each phase's time when its command ran at least this long.
_PHASES_AFTER_S = 10.0


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


def phase(subject: str) -> str:
    """The phase a subject belongs to: its words up to the first that names one thing ("probe 0003-x on
    v0.30.0" -> "probe", "vllm 0.30.0" -> "vllm", "upstream tests of 0003 on v0.30.0" -> "upstream tests")."""
    words: list[str] = []
    for word in subject.split():
        if word in ("of", "on") or any(c.isdigit() for c in word):
            break
        words.append(word)
    return " ".join(words) or subject


class ProgressView:
    """A reporter (call it with events) that draws on stderr for the length of a `with` block; with `phases`, a
    block that ran long ends with one line of where its time went (each phase from its first event to its last
    subject's end: phases overlap, so they need not add up to the whole)."""

    def __init__(self, stream: TextIO | None = None, *, live: bool | None = None, phases: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.phases = phases
        self._began = time.monotonic()
        self._spans: dict[str, tuple[float, float, frozenset[str]]] = {}  # phase -> (first event, last end, ended)
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
        total = time.monotonic() - self._began
        if self.phases and kind is None and self._spans and total >= _PHASES_AFTER_S:
            print(self.phase_line(total), file=self.stream, flush=True)

    def phase_line(self, total: float) -> str:
        """Each phase's seconds in the order they began, and how many subjects ended in it."""
        parts = [f"{name} {end - first:.1f}s" + (f" ({len(ended)})" if len(ended) > 1 else "")
                 for name, (first, end, ended) in sorted(self._spans.items(), key=lambda item: item[1][0])
                 if ended]
        return f"time by phase (they overlap): {', '.join(parts)}; in all {total:.1f}s"

    def __call__(self, event: Event) -> None:
        with self._lock:
            if self.phases:
                now = time.monotonic()
                first, end, ended = self._spans.get(phase(event.subject), (now, now, frozenset()))
                if event.final:  # a subject may end more than once (a release: downloaded, then committed)
                    end, ended = now, ended | {event.subject}
                self._spans[phase(event.subject)] = (first, end, ended)
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
