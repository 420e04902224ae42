"""The stall watchdog: every request a check sends runs under it, so a hung engine fails the check in
`stall_s`, not in `request_timeout_s`.

The rule is the client's: requests are outstanding and none has received a token for `stall_s`. /metrics,
read a few times a second, only excuses a quiet stream while the engine visibly works (a long prefill moves
vllm:iteration_tokens_total) and says what the engine reports. It cannot be the rule alone: with the
engine core stopped, /health answers 200 and /metrics keeps its last numbers (0 running, 0 waiting).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from vpatch.deploy.client import Server, ServerError
from vpatch.deploy.readings import Metrics

T = TypeVar("T")
Tick = Callable[[], None]
SAMPLE_EVERY_S = 0.25
_POLL_S = 0.1


class Stalled(ServerError):
    """Requests were outstanding and no token came for stall_s: the engine is stalled."""


class Aborted(ServerError):
    """The watch's `abort` said stop (the memory floor was crossed): the requests are abandoned."""


@dataclass(frozen=True)
class Reading:
    at: float  # time.monotonic()
    running: float | None
    waiting: float | None
    work: float | None  # tokens the engine has processed: generation + vllm:iteration_tokens_total_sum
    kv_usage: float | None
    preemptions: float | None
    stepped: float | None = None  # vllm:iteration_tokens_total_sum: prompt and generated tokens the engine stepped
    generated: float | None = None  # vllm:generation_tokens_total

    @classmethod
    def of(cls, metrics: Metrics, at: float) -> Reading:
        generated, stepped = metrics.total("vllm:generation_tokens_total"), metrics.total("vllm:iteration_tokens_total_sum")
        work = None if generated is None and stepped is None else (generated or 0.0) + (stepped or 0.0)
        return cls(at, metrics.total("vllm:num_requests_running"), metrics.total("vllm:num_requests_waiting"), work,
                   metrics.kv_usage, metrics.preemptions, stepped, generated)

    def show(self) -> str:
        def n(v: float | None) -> str:
            return "?" if v is None else f"{v:.0f}"
        return f"{n(self.running)} running, {n(self.waiting)} waiting"


class Watchdog:
    """Tracks the outstanding requests of one server (last token of each) and samples its /metrics."""

    def __init__(self, server: Server, stall_s: float, *, sample_every: float = SAMPLE_EVERY_S) -> None:
        self.server = server
        self.stall_s = stall_s
        self.sample_every = sample_every
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._last_token: dict[int, float] = {}  # outstanding request -> when it last received something
        self.readings: list[Reading] = []
        self._sampler: threading.Thread | None = None
        # Called with each reading as it is taken (the time series of the checks), on the sampling thread.
        self.listeners: list[Callable[[Reading], None]] = []
        # Asked while requests are outstanding: a reason to give up on them now (the memory floor), or None.
        self.abort: Callable[[], str | None] | None = None

    # -- requests -------------------------------------------------------------------------------------------
    def _begin(self) -> tuple[int, Tick]:
        rid = next(self._ids)
        with self._lock:
            self._last_token[rid] = time.monotonic()
        self._ensure_sampler()

        def tick() -> None:
            with self._lock:
                if rid in self._last_token:
                    self._last_token[rid] = time.monotonic()
        return rid, tick

    def _end(self, rid: int) -> None:
        with self._lock:
            self._last_token.pop(rid, None)

    def call(self, request: Callable[[Tick], T]) -> T:
        """Run `request(tick)` (tick: called as each token arrives) on a worker thread while this thread
        watches; Stalled as soon as the rule says so (the worker is abandoned: the rollback stops its server)."""
        return self.gather([request])[0]  # type: ignore[return-value]

    def gather(self, requests: Sequence[Callable[[Tick], T]], *, errors_as_values: bool = False) -> list[T | str]:
        """Run `requests` at once, each under the watch; their results in order. A ServerError is raised (or,
        with `errors_as_values`, returned as its message); a stall raises Stalled for the whole lot."""
        results: list[T | str | None] = [None] * len(requests)
        failures: list[ServerError | None] = [None] * len(requests)
        done = [threading.Event() for _ in requests]
        rids: list[int] = []
        for i, request in enumerate(requests):
            rid, tick = self._begin()
            rids.append(rid)

            def work(i: int = i, rid: int = rid, tick: Tick = tick, request: Callable[[Tick], T] = request) -> None:
                try:
                    results[i] = request(tick)
                except ServerError as exc:
                    failures[i] = exc
                finally:
                    self._end(rid)
                    done[i].set()
            threading.Thread(target=work, daemon=True, name=f"vpatch-request-{rid}").start()
        try:
            for event in done:
                while not event.wait(_POLL_S):
                    why = self.stalled()
                    if why is not None:
                        raise Stalled(why)
                    stop = self.abort() if self.abort is not None else None
                    if stop is not None:
                        raise Aborted(stop)
        finally:
            for rid in rids:
                self._end(rid)  # abandoned on a stall or Ctrl-C: no longer counted as outstanding
        out: list[T | str] = []
        for result, failure in zip(results, failures, strict=True):
            if failure is not None and not errors_as_values:
                raise failure
            out.append(failure.message if failure is not None else result)  # type: ignore[arg-type]
        return out

    # -- the rule -------------------------------------------------------------------------------------------
    def stalled(self, now: float | None = None) -> str | None:
        """Why the engine is stalled, or None: outstanding requests, no token for stall_s, and /metrics shows
        no work done in that time either (or cannot be read)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            outstanding = len(self._last_token)
            latest = max(self._last_token.values(), default=now)
            readings = list(self.readings)
        quiet = now - latest
        if not outstanding or quiet < self.stall_s:
            return None
        window = [r for r in readings if r.at >= latest]
        works = [r.work for r in window if r.work is not None]
        if len(works) >= 2 and max(works) > min(works):
            return None  # the engine works (a long prefill): the stream is quiet, not stalled
        last = window[-1] if window else None
        if last is None:
            metrics = "metrics unreadable"
        else:
            metrics = f"metrics: {last.show()}, counters unchanged for {quiet:.0f}s" if works else \
                f"metrics: {last.show()}, no token counters"
        return f"{outstanding} request(s), no token for {quiet:.0f}s (stall_s {self.stall_s:.0f}); {metrics}: the engine is stalled"

    # -- metrics --------------------------------------------------------------------------------------------
    def _ensure_sampler(self) -> None:
        with self._lock:
            if self._sampler is not None and self._sampler.is_alive():
                return
            self._sampler = threading.Thread(target=self._sample_loop, daemon=True, name="vpatch-metrics")
            self._sampler.start()

    def _sample_loop(self) -> None:
        while True:
            with self._lock:
                if not self._last_token:
                    self._sampler = None
                    return
            self.sample()
            time.sleep(self.sample_every)

    def sample(self) -> Reading | None:
        """One /metrics reading, kept (None when /metrics did not answer in 2 s)."""
        try:
            reading = Reading.of(self.server.metrics(timeout=2.0), time.monotonic())
        except ServerError:
            return None
        with self._lock:
            self.readings.append(reading)
            del self.readings[:-2000]
            listeners = list(self.listeners)
        for listen in listeners:
            listen(reading)
        return reading
