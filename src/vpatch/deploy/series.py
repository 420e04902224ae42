"""The time series a pass of the check suite records from its own samples, for the journal, --json and the report.

Times are seconds since the pass began (its first check). Everything here is what the checks measured as
they ran (the watchdog's /metrics readings, the streamed tokens, the memory readings), never terminal output.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class BlockPoint:
    """One reading during the block-cost request: blocks it held, and what the geometry predicts for the
    tokens the engine had processed for it by then (None where /metrics has no step-token counter)."""

    t: float
    held: int
    predicted: int | None


@dataclass(frozen=True)
class RequestPoint:
    """One request a check sent alone (or the parallel check's), timed on the client."""

    check: str
    t: float  # when it finished
    ttft_s: float
    decode_tps: float | None
    seconds: float
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class MemoryPoint:
    """One device's memory at one time: a GPU (per card) or the container against its limit."""

    t: float
    device: str
    used_mib: float
    total_mib: float
    check: str = ""  # the check that was running
    resident_mib: float | None = None  # of used, a container's anonymous memory (the rest: active page cache)

    @property
    def free_mib(self) -> float:
        return self.total_mib - self.used_mib


@dataclass(frozen=True)
class PassEvent:
    """A moment worth marking: a preemption (count: the run's total so far) or a stall the watchdog saw."""

    t: float
    check: str
    what: str
    count: int = 0


@dataclass(frozen=True)
class PassSeries:
    """Everything recorded over one pass of the suite (one server), in time order per list."""

    block_cost: tuple[BlockPoint, ...] = ()
    block_geometry: tuple[int, int] | None = None  # (blocks, block_size) of the pool the prediction uses
    requests: tuple[RequestPoint, ...] = ()
    parallel: tuple[tuple[tuple[float, int], ...], ...] = ()  # per request: (t, tokens received so far)
    preemptions: tuple[PassEvent, ...] = ()
    throughput: tuple[tuple[float, float], ...] = ()  # (t, engine tokens/s since the reading before)
    stalls: tuple[PassEvent, ...] = ()
    memory: tuple[MemoryPoint, ...] = ()
    memory_floor_mib: float | None = None

    @property
    def empty(self) -> bool:
        return not (self.block_cost or self.requests or self.parallel or self.throughput or self.memory)

    def lowest_memory(self) -> MemoryPoint | None:
        return min(self.memory, key=lambda m: m.free_mib, default=None)

    def to_json(self) -> dict[str, Any]:
        return {
            "block_cost": [{"t": round(p.t, 3), "held": p.held, "predicted": p.predicted} for p in self.block_cost],
            "block_geometry": list(self.block_geometry) if self.block_geometry else None,
            "requests": [{"check": r.check, "t": round(r.t, 3), "ttft_s": round(r.ttft_s, 4),
                          "decode_tps": None if r.decode_tps is None else round(r.decode_tps, 2),
                          "seconds": round(r.seconds, 3), "prompt_tokens": r.prompt_tokens,
                          "completion_tokens": r.completion_tokens} for r in self.requests],
            "parallel": [[[round(t, 3), n] for t, n in request] for request in self.parallel],
            "preemptions": [_event(e) for e in self.preemptions],
            "throughput": [[round(t, 3), round(v, 2)] for t, v in self.throughput],
            "stalls": [_event(e) for e in self.stalls],
            "memory": [{"t": round(m.t, 3), "device": m.device, "used_mib": round(m.used_mib, 1),
                        "total_mib": round(m.total_mib, 1), "check": m.check,
                        **({} if m.resident_mib is None else {"resident_mib": round(m.resident_mib, 1)})}
                       for m in self.memory],
            "memory_floor_mib": self.memory_floor_mib,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PassSeries:
        """Read back what to_json wrote (a KeyError/TypeError/ValueError on a malformed record: the caller's
        records.load turns it into a JournalError naming the file)."""
        geometry = data.get("block_geometry")
        return cls(
            block_cost=tuple(BlockPoint(float(p["t"]), int(p["held"]), None if p["predicted"] is None else int(p["predicted"]))
                             for p in data["block_cost"]),
            block_geometry=(int(geometry[0]), int(geometry[1])) if geometry else None,
            requests=tuple(RequestPoint(str(r["check"]), float(r["t"]), float(r["ttft_s"]),
                                        None if r["decode_tps"] is None else float(r["decode_tps"]), float(r["seconds"]),
                                        int(r["prompt_tokens"]), int(r["completion_tokens"])) for r in data["requests"]),
            parallel=tuple(tuple((float(t), int(n)) for t, n in request) for request in data["parallel"]),
            preemptions=tuple(_read_event(e) for e in data["preemptions"]),
            throughput=tuple((float(t), float(v)) for t, v in data["throughput"]),
            stalls=tuple(_read_event(e) for e in data["stalls"]),
            memory=tuple(MemoryPoint(float(m["t"]), str(m["device"]), float(m["used_mib"]), float(m["total_mib"]),
                                     str(m.get("check", "")),
                                     None if m.get("resident_mib") is None else float(m["resident_mib"]))
                         for m in data["memory"]),
            memory_floor_mib=None if data.get("memory_floor_mib") is None else float(data["memory_floor_mib"]),
        )


def _event(e: PassEvent) -> dict[str, Any]:
    return {"t": round(e.t, 3), "check": e.check, "what": e.what, "count": e.count}


def _read_event(e: Mapping[str, Any]) -> PassEvent:
    return PassEvent(float(e["t"]), str(e["check"]), str(e["what"]), int(e.get("count", 0)))


@dataclass
class Recorder:
    """Collects a PassSeries while the checks run; appended to from the request and sampler threads."""

    started: float  # time.monotonic() when the pass began
    check: str = ""  # the check running now
    _lock: threading.Lock = field(default_factory=threading.Lock)
    block_cost: list[BlockPoint] = field(default_factory=list)
    block_geometry: tuple[int, int] | None = None
    requests: list[RequestPoint] = field(default_factory=list)
    parallel: list[list[tuple[float, int]]] = field(default_factory=list)
    preemptions: list[PassEvent] = field(default_factory=list)
    throughput: list[tuple[float, float]] = field(default_factory=list)
    stalls: list[PassEvent] = field(default_factory=list)
    memory: list[MemoryPoint] = field(default_factory=list)
    memory_floor_mib: float | None = None

    def at(self, monotonic: float) -> float:
        return monotonic - self.started

    def add(self, name: str, items: Iterable[Any]) -> None:
        with self._lock:
            getattr(self, name).extend(items)

    def freeze(self) -> PassSeries:
        with self._lock:
            return PassSeries(
                block_cost=tuple(self.block_cost), block_geometry=self.block_geometry, requests=tuple(self.requests),
                parallel=tuple(tuple(r) for r in self.parallel), preemptions=tuple(self.preemptions),
                throughput=tuple(self.throughput), stalls=tuple(self.stalls),
                memory=tuple(sorted(self.memory, key=lambda m: m.t)), memory_floor_mib=self.memory_floor_mib)
