"""The judges: pure functions that turn a check's measurement into pass, fail or error, and what a check
result and the compared figures are. deploy/measure.py measures the server and hands its readings here."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from vpatch.config import (
    BlockCostCheck,
    KvPoolCheck,
    MemoryCheck,
    ParallelCheck,
    TimingCheck,
)
from vpatch.deploy.client import Timing
from vpatch.deploy.noise import spread
from vpatch.deploy.readings import (
    BlockCost,
    CacheGeometry,
    KvPool,
    LogFinding,
    NotStrictJson,
    StreamedChat,
    strict_json,
)
from vpatch.deploy.series import MemoryPoint


class CheckStatus(str, Enum):
    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"  # the measurement itself failed (e.g. no KV usage seen): not a pass, the deploy rolls back
    SKIP = "skipped"


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: CheckStatus
    figure: str  # the measured number(s) with the threshold, e.g. "1,050,422 tokens (floor 1,000,000)"
    detail: str = ""
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.status in (CheckStatus.FAIL, CheckStatus.ERROR)


@dataclass(frozen=True)
class Figures:
    """The numbers a baseline and a candidate are compared by, side by side (None: not measured)."""

    kv_pool_tokens: int | None = None
    max_concurrency: float | None = None
    concurrency_tokens: int | None = None
    tokens_per_block: float | None = None
    blocks_ratio: float | None = None
    ttft_s: float | None = None
    decode_tps: float | None = None
    needles_found: str | None = None
    questions_right: str | None = None
    preemptions: int | None = None
    log_findings: int | None = None
    # The timing check's repeats (deploy/noise.py judges them): seconds, tokens/s, seconds, seconds.
    ttft_samples: tuple[float, ...] | None = None
    decode_samples: tuple[float, ...] | None = None
    prefill_samples: tuple[float, ...] | None = None
    makespan_samples: tuple[float, ...] | None = None
    # Of the short timing answers, how many came in bursts and so gave no decode rate (a loaded host: every one
    # of five, on both sides, in a shuffled run at load ~5); None: an older record, or no timing check.
    decode_bursts: int | None = None
    timing_min_change: float | None = None
    timing_load: tuple[float, float] | None = None  # the host's 1-minute load average as the repeats began, ended
    timing_cores: int | None = None  # the host's cores (what its load average is read against)
    # The share of the repeats' wall time in which some runnable task on the host waited for a CPU (the kernel's
    # pressure stall count, /proc/pressure/cpu): None where the kernel keeps none, or an older record.
    timing_stall: float | None = None


def judge_kv_pool(pool: KvPool | None, check: KvPoolCheck, baseline: KvPool | None) -> tuple[CheckStatus, str, str]:
    if pool is None:
        return CheckStatus.FAIL, "no 'KV cache size' line", "the start log does not announce the KV pool; did the engine start?"
    figure = f"{pool.tokens:,} tokens (floor {check.min_tokens:,})"
    if pool.concurrency is not None:
        figure += f", {pool.concurrency:.2f}x at {pool.request_tokens:,} tokens"
    problems = []
    if pool.tokens < check.min_tokens:
        problems.append(f"pool {pool.tokens:,} tokens is below the floor {check.min_tokens:,}")
    if check.min_concurrency is not None and (pool.concurrency or 0.0) < check.min_concurrency:
        problems.append(f"max concurrency {pool.concurrency} is below {check.min_concurrency}")
    if check.max_drop is not None and baseline is not None and pool.tokens < baseline.tokens * (1 - check.max_drop):
        problems.append(f"pool shrank from {baseline.tokens:,} (baseline) by more than {check.max_drop:.0%}")
    return (CheckStatus.FAIL if problems else CheckStatus.PASS), figure, "; ".join(problems)


def judge_block_cost(cost: BlockCost, check: BlockCostCheck) -> tuple[CheckStatus, str, str]:
    if cost.tokens == 0:
        # the answer carried no usage: it was cut short (the server or its daemon went away), nothing to judge
        return CheckStatus.ERROR, f"{cost.held} blocks seen, no token count in the answer", (
            "measurement error: the request's stream ended without its usage (prompt and completion tokens): "
            "the server cut the answer short or went away, so the blocks it holds cannot be judged")
    figure = (f"{cost.held} blocks for {cost.tokens:,} tokens = 1 per {cost.tokens_per_block:.0f} tokens; "
              f"geometry predicts {cost.predicted} ({cost.ratio:.2f}x, limit {check.max_ratio:.2f}x)")
    if cost.held == 0:
        return CheckStatus.ERROR, figure, ("measurement error: no KV usage was seen while the request ran, although "
                                      "/metrics was read back to back while it streamed (no kv_cache_usage_perc, or it never moved)")
    if cost.ratio > check.max_ratio:
        return CheckStatus.FAIL, figure, "a request holds more KV blocks than the start log's arithmetic assumes"
    return CheckStatus.PASS, figure, ""


def judge_tool_call(chat: StreamedChat) -> tuple[CheckStatus, str, str]:
    if not chat.tool_calls:
        return CheckStatus.FAIL, "no tool call", f"finish_reason {chat.finish_reason}; text: {chat.text[:200]!r}"
    for call in chat.tool_calls:
        try:
            parsed = strict_json(call.arguments)
        except NotStrictJson as exc:
            return CheckStatus.FAIL, f"{call.name}: not strict JSON", f"{exc}: {call.arguments[:200]}"
        except ValueError as exc:
            return CheckStatus.FAIL, f"{call.name}: invalid JSON", f"{exc}: {call.arguments[:200]}"
        if not isinstance(parsed, dict):
            return CheckStatus.FAIL, f"{call.name}: arguments are not an object", call.arguments[:200]
    names = ", ".join(c.name for c in chat.tool_calls)
    return CheckStatus.PASS, f"{len(chat.tool_calls)} call(s) ({names}), strict JSON", ""


def answer_is_right(answer: str, expect: Sequence[str]) -> bool:
    """An expected answer appears as a whole word ("6" is not found in "16", "ls" not in "tools")."""
    return any(re.search(rf"(?<!\w){re.escape(e)}(?!\w)", answer, re.I) for e in expect)


def judge_count(what: str, right: int, total: int, minimum: int) -> tuple[CheckStatus, str, str]:
    figure = f"{right} of {total} {what} (min {minimum})"
    return (CheckStatus.PASS, figure, "") if right >= minimum else (CheckStatus.FAIL, figure, f"fewer than {minimum} right")


def judge_parallel(timings: Sequence[Timing | str], preemptions: int, check: ParallelCheck) -> tuple[CheckStatus, str, str]:
    errors = [t for t in timings if isinstance(t, str)]
    done = [t for t in timings if isinstance(t, Timing)]
    short = [t for t in done if t.completion_tokens < check.max_tokens]
    wall = max((t.seconds for t in done), default=0.0)
    figure = (f"{len(done)}/{check.requests} finished, {preemptions} preemption(s) (max {check.max_preemptions}), "
              f"slowest {wall:.1f}s")
    problems = []
    if preemptions > check.max_preemptions:
        problems.append(f"{preemptions} preemptions: the KV pool cannot hold {check.requests} requests of "
                        f"{check.prompt_tokens:,} tokens")
    if errors:
        problems.append(f"{len(errors)} request(s) failed: {errors[0][:200]}")
    if short:
        problems.append(f"{len(short)} request(s) stopped early")
    return (CheckStatus.FAIL if problems else CheckStatus.PASS), figure, "; ".join(problems)


def ceiling_tokens(max_model_len: int, geometry: CacheGeometry) -> int:
    """The longest request the server can finish: the frontend's max_model_len, or the pool without its
    null block (vLLM's BlockPool keeps one block back; one-block-short: startup sized against all N)."""
    return min(max_model_len, (geometry.blocks - 1) * geometry.block_size)


def judge_ceiling(timing: Timing, waiting_after: float | None, max_model_len: int, geometry: CacheGeometry,
                  ) -> tuple[CheckStatus, str, str]:
    usable = (geometry.blocks - 1) * geometry.block_size
    figure = (f"{timing.prompt_tokens:,} + {timing.completion_tokens} tokens, finish {timing.finish_reason}; "
              f"max_model_len {max_model_len:,}, pool {geometry.blocks} x {geometry.block_size} "
              f"({usable:,} usable)")
    if timing.finish_reason not in ("stop", "length") or timing.completion_tokens < 1:
        return CheckStatus.FAIL, figure, "the request at the ceiling did not finish with stop or length"
    if waiting_after:
        return CheckStatus.FAIL, figure, f"{waiting_after:.0f} request(s) left waiting after it finished"
    return CheckStatus.PASS, figure, ""


def judge_memory(points: Sequence[MemoryPoint], check: MemoryCheck) -> tuple[CheckStatus, str, str]:
    """The lowest free memory any device reached while the checks sent requests, against the floor."""
    if not points:
        return CheckStatus.ERROR, "no memory reading", (
            "measurement error: neither nvidia-smi nor docker's stats gave a reading while the checks ran")
    low = min(points, key=lambda p: p.free_mib)
    devices = sorted({p.device for p in points})
    figure = (f"lowest {low.free_mib:,.0f} MiB free of {low.total_mib:,.0f} MiB on {low.device} at {low.t:.1f}s"
              f"{f' ({low.check})' if low.check else ''}; floor {check.min_free_mib:,.0f} MiB; "
              f"{len(points)} readings of {', '.join(devices)}")
    if low.free_mib < check.min_free_mib:
        return CheckStatus.FAIL, figure, (f"{low.device} went below the floor of {check.min_free_mib:,.0f} MiB free: "
                                     "the candidate needs more working memory than the device has to spare")
    return CheckStatus.PASS, figure, ""


def judge_log(findings: Sequence[LogFinding]) -> tuple[CheckStatus, str, str]:
    if not findings:
        return CheckStatus.PASS, "no configured pattern in the log", ""
    figure = ", ".join(f"{f.pattern!r} x{f.count}" for f in findings)
    return CheckStatus.FAIL, figure, " | ".join(f.lines[0] for f in findings)


def judge_timing(samples: dict[str, list[float]], errors: list[str], check: TimingCheck) -> tuple[CheckStatus, str, str]:
    """A measurement: it passes when every request finished; the figures are judged against the baseline's
    by deploy/noise.py, not here."""
    units = {"ttft": ("TTFT", "s"), "decode": ("decode", "tok/s"), "prefill": ("long prefill", "s"),
             "makespan": ("parallel makespan", "s")}
    parts = []
    for key, (label, unit) in units.items():
        found = spread(samples.get(key))
        if found is not None:
            parts.append(f"{label} {found.shown()} {unit}")
    figure = "; ".join(parts) or "no sample"
    if errors:
        return CheckStatus.FAIL, figure, f"{len(errors)} timing request(s) failed: {errors[0][:200]}"
    return CheckStatus.PASS, figure + f" ({check.repeats} repeats)", ""
