"""What a start cost, read from the server's own start log: load times, where the memory went, the KV pool.

vLLM writes the answer per worker (one line per card, or the one CPU worker): "Loading weights took …",
"Model loading took … GiB memory", "Available KV cache memory: … GiB", "Graph capturing finished in …".
Each pattern below names the vLLM releases whose sources write its line (read from their format strings;
tests/deploy/test_ledger.py builds lines from those format strings, release by release, and checks the
claim). A line the server did not write is absent from the ledger: nothing is guessed or filled in.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

_NUM = r"-?[\d,]*\.?\d+"
_ALL = ("v0.28.0", "v0.29.0", "v0.30.0", "v0.31.0", "v0.32.0", "v0.33.0", "v0.34.0")
_UP_TO_33 = _ALL[:-1]


@dataclass(frozen=True)
class LinePattern:
    """One line vLLM writes while it starts. `marker` is a literal piece of its format string as the source
    spells it (how the test finds the format in each release); `slots` names, per placeholder of the format
    in order, the ledger field it fills (None: not kept), one tuple per wording where releases differ."""

    name: str
    marker: str
    regex: re.Pattern[str]
    slots: tuple[tuple[str | None, ...], ...]
    releases: tuple[str, ...]  # the releases whose sources write this line
    where: str  # the vLLM module that writes it (GPU path, CPU path or both)


def _p(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern.replace("NUM", _NUM))


PATTERNS: tuple[LinePattern, ...] = (
    LinePattern("version", "Initializing a V1 LLM engine", _p(r"Initializing a V1 LLM engine \(v?(?P<version>[^)\s]+)\)"),
                (("version", None),), _ALL, "v1/engine/core.py"),
    LinePattern("weights load", "Loading weights took", _p(r"Loading weights took (?P<weights_load_s>NUM) seconds"),
                (("weights_load_s",),), _ALL, "model_executor/model_loader (GPU and CPU)"),
    LinePattern("model load", "Model loading took",
                _p(r"Model loading took (?P<weights_gib>NUM) GiB memory and (?P<model_load_s>NUM) seconds"),
                (("weights_gib", "model_load_s"),), _ALL, "v1/worker/gpu_model_runner.py, gpu/model_runner.py"),
    # logger.debug: only with VLLM_LOGGING_LEVEL=DEBUG; absent otherwise.
    LinePattern("memory profile", "Memory profiling takes",
                _p(r"Memory profiling takes (?P<profile_s>NUM) seconds\. Total non KV cache memory: "
                   r"(?P<non_kv_gib>NUM) ?GiB; torch peak memory increase: (?P<torch_peak_gib>NUM) ?GiB; "
                   r"total consumed \(from mem_get_info\): (?P<consumed_gib>NUM) ?GiB; "
                   r"weights memory: (?P<profile_weights_gib>NUM) ?GiB"),
                (("profile_s", "non_kv_gib", "torch_peak_gib", "consumed_gib", "profile_weights_gib"),),
                _ALL, "utils/mem_utils.py (logged at debug level)"),
    LinePattern("memory usage", "for consumed memory (weights + non-torch)",
                _p(r"Free memory on device \((?P<free_at_start_gib>NUM)/(?P<device_total_gib>NUM) GiB\) on startup\."
                   r".*?Actual usage is (?P<consumed_gib>NUM) GiB for consumed memory \(weights \+ non-torch\), "
                   r"(?P<peak_activation_gib>NUM) GiB for peak activation, and (?P<cuda_graph_gib>NUM) GiB for "
                   r"CUDAGraph memory"),
                (("free_at_start_gib", "device_total_gib", None, None, "consumed_gib", "peak_activation_gib",
                  "cuda_graph_gib"),), _ALL, "v1/worker/gpu_worker.py"),
    LinePattern("cuda graph estimate", "Estimated CUDA graph memory: %",
                _p(r"Estimated CUDA graph memory: (?P<cuda_graph_estimate_gib>NUM) GiB total"),
                (("cuda_graph_estimate_gib",),), _UP_TO_33, "v1/worker/gpu_model_runner.py"),
    LinePattern("cuda graph pool", "CUDA graph pool memory",
                _p(r"CUDA graph pool memory: (?P<cuda_graph_gib>NUM) GiB \(actual\), "
                   r"(?P<cuda_graph_estimate_gib>NUM) GiB \(estimated\)"),
                (("cuda_graph_gib", "cuda_graph_estimate_gib"),), _ALL, "v1/worker/gpu_worker.py"),
    LinePattern("graph capture", "Graph capturing finished",
                _p(r"Graph capturing finished in (?P<graph_capture_s>NUM) secs, took (?P<graph_capture_gib>NUM) GiB"),
                (("graph_capture_s", "graph_capture_gib"),), _ALL, "v1/worker/gpu_model_runner.py, gpu/model_runner.py"),
    LinePattern("kv memory", "Available KV cache memory",
                _p(r"Available KV cache memory: (?P<kv_memory_gib>NUM) GiB"),
                (("kv_memory_gib",),), _ALL, "v1/worker/gpu_worker.py"),
    LinePattern("cpu kv memory (explicit)", "Explicitly set (",
                _p(r"Explicitly set \((?P<kv_memory_gib>NUM)/(?P<device_total_gib>NUM)\) GiB for KV cache"),
                (("kv_memory_gib", "device_total_gib"),), _ALL, "v1/worker/cpu_worker.py"),
    LinePattern("cpu kv memory (auto)", "memory was consumed by non-kv usages",
                _p(r"Auto set \((?P<kv_memory_gib>NUM)/(?P<device_total_gib>NUM)\) GiB for KV cache on node NUM, "
                   r"with (?P<requested_gib>NUM) GiB requested memory for the worker\. "
                   r"(?P<non_kv_gib>NUM) GiB memory was consumed by non-kv usages"),
                (("kv_memory_gib", "device_total_gib", None, "requested_gib", "non_kv_gib"),), _ALL,
                "v1/worker/cpu_worker.py"),
    LinePattern("kv pool", "KV cache size: %s tokens",
                _p(r"\b(?:[A-Za-z+ ]+ )?KV cache size: (?P<kv_tokens>NUM) tokens, Maximum concurrency for "
                   r"(?P<concurrency_tokens>NUM) tokens per request: (?P<max_concurrency>NUM)x"),
                (("kv_tokens", "concurrency_tokens", "max_concurrency"),
                 (None, "kv_tokens", "concurrency_tokens", "max_concurrency")), _ALL, "v1/core/kv_cache_utils.py"),
    LinePattern("engine init", "init engine (profile, create kv cache, warmup model) took",
                _p(r"init engine \(profile, create kv cache, warmup model\) took (?P<engine_init_s>NUM) s"),
                (("engine_init_s",),), _ALL, "v1/engine/core.py"),
)


@dataclass(frozen=True)
class Field:
    name: str
    label: str
    unit: str  # "GiB", "s", "tokens", "x"


# In the order the ledger is shown: the start's phases, then where the memory went, then the pool.
FIELDS: tuple[Field, ...] = (
    Field("weights_load_s", "weights load", "s"),
    Field("model_load_s", "model load (weights and setup)", "s"),
    Field("profile_s", "memory profiling", "s"),
    Field("graph_capture_s", "CUDA graph capture", "s"),
    Field("engine_init_s", "engine init (profile, KV cache, warmup)", "s"),
    Field("first_line_s", "vLLM's first line after (container start to its first stamped line)", "s"),
    Field("serving_s", "serving after (container start to 'Starting vLLM server')", "s"),
    Field("healthy_s", "time to healthy (the health check)", "s"),
    Field("device_total_gib", "device memory", "GiB"),
    Field("free_at_start_gib", "free at start", "GiB"),
    Field("weights_gib", "weights memory", "GiB"),
    Field("consumed_gib", "consumed (weights + non-torch)", "GiB"),
    Field("non_torch_gib", "non-torch memory (consumed - weights)", "GiB"),
    Field("torch_peak_gib", "torch peak increase", "GiB"),
    Field("peak_activation_gib", "peak activation", "GiB"),
    Field("non_kv_gib", "non-KV memory", "GiB"),
    Field("cuda_graph_estimate_gib", "CUDA graph memory (estimate)", "GiB"),
    Field("cuda_graph_gib", "CUDA graph memory (actual)", "GiB"),
    Field("graph_capture_gib", "CUDA graph capture took", "GiB"),
    Field("requested_gib", "requested memory", "GiB"),
    Field("kv_memory_gib", "available KV cache memory", "GiB"),
    Field("kv_tokens", "KV pool", "tokens"),
    Field("max_concurrency", "max concurrency", "x"),
)
_BY_NAME = {f.name: f for f in FIELDS}
# Read for the ledger's arithmetic or a label only, never shown as rows of their own.
_HIDDEN = {"profile_weights_gib", "concurrency_tokens", "version"}
# Not a line of the log: derived from two (non-torch), a stamp against the container's start, the health check.
_DERIVED = {"non_torch_gib", "first_line_s", "serving_s", "healthy_s"}

# "(Worker_TP1 pid=42) INFO 09-24 20:01:02 [gpu_worker.py:579] …" / "(EngineCore_DP0 pid=7)" / "(EngineCore pid=7)"
_WORKER = re.compile(r"^\((?P<who>[A-Za-z][\w-]*) pid=\d+\)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# The API server's line once it listens (logger.info("Starting vLLM server on %s", …) in every release
# v0.28.0..v0.34.0), stamped by vLLM's logger as "%m-%d %H:%M:%S" (no year: the container's start gives it).
SERVING = "Starting vLLM server on"
_STAMP = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR) (\d\d-\d\d \d\d:\d\d:\d\d) ")
SERVER = "server"  # a line without a process prefix, or a figure measured from outside (time to healthy)


@dataclass(frozen=True)
class StartLedger:
    """Figures of one start, per worker: (field, worker, value); `version` as the engine announced itself."""

    values: tuple[tuple[str, str, float], ...] = ()
    version: str | None = None

    def per_worker(self, field: str) -> dict[str, float]:
        return {w: v for f, w, v in self.values if f == field}

    @property
    def workers(self) -> list[str]:
        return sorted({w for _, w, _ in self.values if w != SERVER})

    def mean(self, field: str) -> float | None:
        found = self.per_worker(field)
        return sum(found.values()) / len(found) if found else None

    def with_value(self, field: str, worker: str, value: float) -> StartLedger:
        kept = tuple(v for v in self.values if not (v[0] == field and v[1] == worker))
        return StartLedger((*kept, (field, worker, value)), self.version)

    @property
    def empty(self) -> bool:
        return not self.values

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version,
                "values": [{"field": f, "worker": w, "value": v} for f, w, v in self.values]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> StartLedger:
        if not data:
            return cls()
        return cls(tuple((str(v["field"]), str(v["worker"]), float(v["value"])) for v in data["values"]),
                   data.get("version"))


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def parse_line(line: str) -> tuple[str, dict[str, str]] | None:
    """(worker, {field: text}) for one start-log line the ledger reads; None for any other line."""
    line = _ANSI.sub("", line).strip()
    who = _WORKER.match(line)
    found: dict[str, str] = {}
    for pattern in PATTERNS:
        m = pattern.regex.search(line)
        if m:
            found.update({k: v for k, v in m.groupdict().items() if v is not None})
    if not found:
        return None
    return (who["who"] if who else SERVER), found


def parse_start_log(log: str | Iterable[str], *, started_at: datetime | None = None) -> StartLedger:
    """The ledger of the latest start in `log`: per worker the last value of each field (a container's log
    holds every start it had; the latest one counts). Derived: non-torch = consumed - weights, where vLLM
    wrote both for the same worker (its own wording: "consumed memory (weights + non-torch)"); with the
    container's `started_at` (UTC, as docker says it), the seconds until the server's "Starting vLLM server"
    line by that line's own time stamp."""
    lines = log.splitlines() if isinstance(log, str) else log
    values: dict[tuple[str, str], float] = {}
    version = None
    for line in lines:
        if started_at is not None and ("first_line_s", SERVER) not in values:
            # What ran before vLLM (an entrypoint's own work, vLLM's imports) ends at its first stamped line.
            first = _seconds_since(started_at, line)
            if first is not None:
                values[("first_line_s", SERVER)] = first
        if started_at is not None and SERVING in line:
            serving = _seconds_since(started_at, line)
            if serving is not None:
                values[("serving_s", SERVER)] = serving
        parsed = parse_line(line)
        if parsed is None:
            continue
        worker, found = parsed
        for field, text in found.items():
            if field == "version":
                version = text
            else:
                values[(field, worker)] = _number(text)
    for (field, worker), consumed in list(values.items()):
        if field == "consumed_gib" and ("weights_gib", worker) in values:
            values[("non_torch_gib", worker)] = round(consumed - values[("weights_gib", worker)], 2)
    return StartLedger(tuple((f, w, v) for (f, w), v in values.items()), version)


def _seconds_since(started_at: datetime, line: str) -> float | None:
    stamp = _STAMP.search(_ANSI.sub("", line))
    if stamp is None:
        return None
    try:
        at = datetime.strptime(f"{started_at.year}-{stamp[1]}", "%Y-%m-%d %H:%M:%S").replace(tzinfo=started_at.tzinfo)
    except ValueError:
        return None
    if (at - started_at).total_seconds() < -86400:  # a start on 31 December, serving on 1 January
        at = at.replace(year=at.year + 1)
    # The stamp has whole seconds: the start's fraction is dropped too, so equal stamps read 0, never -0.4.
    return max(0.0, (at - started_at.replace(microsecond=0)).total_seconds())


def written_by(version: str | None, field: str) -> bool | None:
    """Whether release `version` writes a line that carries `field` (None: version unknown or not in the
    table): the report says "not written by vX" rather than a bare absence where the table knows."""
    if version is None:
        return None
    tag = version if version.startswith("v") else f"v{version}"
    if tag not in _ALL:
        return None
    return any(tag in p.releases and any(field in s for s in p.slots) for p in PATTERNS)


@dataclass(frozen=True)
class LedgerRow:
    field: str
    label: str
    unit: str
    baseline: dict[str, float]
    candidate: dict[str, float]
    difference: str  # "non-torch memory +1.10 GiB per worker"; "" when equal or one side is absent


def _fmt(value: float, unit: str) -> str:
    if unit == "tokens":
        return f"{value:,.0f}"
    return f"{value:,.2f}"


def shown_per_worker(values: Mapping[str, float], unit: str, absent: str = "absent") -> str:
    """One side's cell: the value (all workers equal), else each worker's."""
    if not values:
        return absent
    distinct = set(values.values())
    if len(distinct) == 1:
        one = _fmt(next(iter(distinct)), unit) + ("" if unit == "x" else f" {unit}")
        return one + (f" x{len(values)} workers" if len(values) > 1 else "")
    return ", ".join(f"{w} {_fmt(v, unit)}" for w, v in sorted(values.items())) + f" {unit}"


# Differences below the log's own resolution are not differences (vLLM prints GiB with two decimals).
_RESOLUTION = {"GiB": 0.01, "s": 0.05, "tokens": 1.0, "x": 0.01}


def ledger_rows(base: StartLedger | None, cand: StartLedger) -> list[LedgerRow]:
    """Every field either side has, in FIELDS order, each difference named in words."""
    out = []
    base = base or StartLedger()
    for f in FIELDS:
        b, c = base.per_worker(f.name), cand.per_worker(f.name)
        if not b and not c:
            continue
        out.append(LedgerRow(f.name, f.label, f.unit, b, c, _difference(f, b, c)))
    return out


def _difference(f: Field, b: Mapping[str, float], c: Mapping[str, float]) -> str:
    if not b or not c:
        return ""
    mb, mc = sum(b.values()) / len(b), sum(c.values()) / len(c)
    delta = mc - mb
    if abs(delta) < _RESOLUTION.get(f.unit, 0.0) - 1e-9:
        return ""
    per = " per worker" if max(len(b), len(c)) > 1 else ""
    unit = "" if f.unit == "x" else f" {f.unit}"
    amount = f"{delta:+,.0f}" if f.unit == "tokens" else f"{delta:+,.2f}"
    return f"{f.label} {amount}{unit}{per}"


def differences(base: StartLedger | None, cand: StartLedger) -> list[str]:
    """The named differences only, in ledger order."""
    return [r.difference for r in ledger_rows(base, cand) if r.difference]


def absent_note(ledger: StartLedger, fields: Sequence[str]) -> list[str]:
    """For fields the log lacks: whether the server's release writes that line at all."""
    notes = []
    for name in fields:
        if ledger.per_worker(name) or name in _HIDDEN or name in _DERIVED:
            continue
        writes = written_by(ledger.version, name)
        if writes is False:
            notes.append(f"{_BY_NAME[name].label}: v{ledger.version.lstrip('v') if ledger.version else '?'} "
                         "does not write this line")
    return notes
