"""The check suite: each check measures the server, then a pure judge turns the measurement into pass/fail."""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from vpatch.deploy.client import Server, ServerError, Timing
from vpatch.deploy.readings import (
    BlockCost,
    CacheGeometry,
    KvPool,
    LogFinding,
    NotStrictJson,
    StreamedChat,
    block_cost,
    kv_pool_from_log,
    log_findings,
    strict_json,
)
from vpatch.deploy.suite import BlockCostCheck, KvPoolCheck, NeedleCheck, ParallelCheck, QuestionCheck, Suite
from vpatch.deploy.watchdog import Tick, Watchdog
from vpatch.progress import Progress

# A tool every server with a tool-call parser can be asked to call; the check only needs the JSON to hold.
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


class Status(str, Enum):
    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"  # the measurement itself failed (e.g. no KV usage seen): not a pass, the deploy rolls back
    SKIP = "skipped"


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: Status
    figure: str  # the measured number(s) with the threshold, e.g. "1,050,422 tokens (floor 1,000,000)"
    detail: str = ""
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.status in (Status.FAIL, Status.ERROR)


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


def judge_kv_pool(pool: KvPool | None, check: KvPoolCheck, baseline: KvPool | None) -> tuple[Status, str, str]:
    if pool is None:
        return Status.FAIL, "no 'KV cache size' line", "the start log does not announce the KV pool; did the engine start?"
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
    return (Status.FAIL if problems else Status.PASS), figure, "; ".join(problems)


def judge_block_cost(cost: BlockCost, check: BlockCostCheck) -> tuple[Status, str, str]:
    if cost.tokens == 0:
        # the answer carried no usage: it was cut short (the server or its daemon went away), nothing to judge
        return Status.ERROR, f"{cost.held} blocks seen, no token count in the answer", (
            "measurement error: the request's stream ended without its usage (prompt and completion tokens): "
            "the server cut the answer short or went away, so the blocks it holds cannot be judged")
    figure = (f"{cost.held} blocks for {cost.tokens:,} tokens = 1 per {cost.tokens_per_block:.0f} tokens; "
              f"geometry predicts {cost.predicted} ({cost.ratio:.2f}x, limit {check.max_ratio:.2f}x)")
    if cost.held == 0:
        return Status.ERROR, figure, ("measurement error: no KV usage was seen while the request ran, although "
                                      "/metrics was read at every token (no kv_cache_usage_perc, or it never moved)")
    if cost.ratio > check.max_ratio:
        return Status.FAIL, figure, "a request holds more KV blocks than the start log's arithmetic assumes"
    return Status.PASS, figure, ""


def judge_tool_call(chat: StreamedChat) -> tuple[Status, str, str]:
    if not chat.tool_calls:
        return Status.FAIL, "no tool call", f"finish_reason {chat.finish_reason}; text: {chat.text[:200]!r}"
    for call in chat.tool_calls:
        try:
            parsed = strict_json(call.arguments)
        except NotStrictJson as exc:
            return Status.FAIL, f"{call.name}: not strict JSON", f"{exc}: {call.arguments[:200]}"
        except ValueError as exc:
            return Status.FAIL, f"{call.name}: invalid JSON", f"{exc}: {call.arguments[:200]}"
        if not isinstance(parsed, dict):
            return Status.FAIL, f"{call.name}: arguments are not an object", call.arguments[:200]
    names = ", ".join(c.name for c in chat.tool_calls)
    return Status.PASS, f"{len(chat.tool_calls)} call(s) ({names}), strict JSON", ""


def answer_is_right(answer: str, expect: Sequence[str]) -> bool:
    """An expected answer appears as a whole word ("6" is not found in "16", "ls" not in "tools")."""
    return any(re.search(rf"(?<!\w){re.escape(e)}(?!\w)", answer, re.I) for e in expect)


def judge_count(what: str, right: int, total: int, minimum: int) -> tuple[Status, str, str]:
    figure = f"{right} of {total} {what} (min {minimum})"
    return (Status.PASS, figure, "") if right >= minimum else (Status.FAIL, figure, f"fewer than {minimum} right")


def judge_parallel(timings: Sequence[Timing | str], preemptions: int, check: ParallelCheck) -> tuple[Status, str, str]:
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
    return (Status.FAIL if problems else Status.PASS), figure, "; ".join(problems)


def ceiling_tokens(max_model_len: int, geometry: CacheGeometry) -> int:
    """The longest request the server can finish: the frontend's max_model_len, or the pool without its
    null block (vLLM's BlockPool keeps one block back; one-block-short: startup sized against all N)."""
    return min(max_model_len, (geometry.blocks - 1) * geometry.block_size)


def judge_ceiling(timing: Timing, waiting_after: float | None, max_model_len: int, geometry: CacheGeometry,
                  ) -> tuple[Status, str, str]:
    usable = (geometry.blocks - 1) * geometry.block_size
    figure = (f"{timing.prompt_tokens:,} + {timing.completion_tokens} tokens, finish {timing.finish_reason}; "
              f"max_model_len {max_model_len:,}, pool {geometry.blocks} x {geometry.block_size} "
              f"({usable:,} usable)")
    if timing.finish_reason not in ("stop", "length") or timing.completion_tokens < 1:
        return Status.FAIL, figure, "the request at the ceiling did not finish with stop or length"
    if waiting_after:
        return Status.FAIL, figure, f"{waiting_after:.0f} request(s) left waiting after it finished"
    return Status.PASS, figure, ""


def judge_log(findings: Sequence[LogFinding]) -> tuple[Status, str, str]:
    if not findings:
        return Status.PASS, "no configured pattern in the log", ""
    figure = ", ".join(f"{f.pattern!r} x{f.count}" for f in findings)
    return Status.FAIL, figure, " | ".join(f.lines[0] for f in findings)


@dataclass
class Run:
    """One pass of the suite over one server: results in order, figures, and the single-request timings."""

    server: Server
    suite: Suite
    read_log: Callable[[], str]  # the container's whole log since it started
    progress: Progress
    baseline_pool: KvPool | None = None
    results: list[CheckResult] = field(default_factory=list)
    figures: Figures = field(default_factory=Figures)
    timings: list[Timing] = field(default_factory=list)
    watch: Watchdog = field(init=False)

    def __post_init__(self) -> None:
        self.watch = Watchdog(self.server, self.suite.stall_s)

    def record(self, name: str, measure: Callable[[], tuple[Status, str, str]]) -> CheckResult:
        self.progress(f"check: {name}")
        start = time.monotonic()
        try:
            status, figure, detail = measure()
        except ServerError as exc:
            status, figure, detail = Status.FAIL, "request failed", exc.message
        result = CheckResult(name, status, figure, detail, time.monotonic() - start)
        self.results.append(result)
        self.progress(f"  {status.value}: {figure}" + (f" ({detail})" if detail and status is Status.FAIL else ""))
        return result

    def skip(self, name: str) -> None:
        self.results.append(CheckResult(name, Status.SKIP, "not configured"))

    def note(self, **figures: Any) -> None:
        self.figures = replace(self.figures, **figures)

    def finish(self) -> None:
        ttfts = [t.ttft_s for t in self.timings]
        # Only requests that decoded a while: a few tokens can arrive in one network read and fake any rate.
        rates = [r for r in (t.decode_tps for t in self.timings if t.completion_tokens >= 16) if r is not None]
        self.note(ttft_s=statistics.median(ttfts) if ttfts else None,
                  decode_tps=statistics.median(rates) if rates else None)


def run_checks(run: Run, *, fail_fast: bool, log_scan: bool = True) -> None:
    """The server-side checks in their fixed order; with `fail_fast` the first failure ends the run. Without
    `log_scan` the last one, the scan of the server's log, is left to `scan_log`, for a caller that sends more
    requests first (the live checks) and wants their effects in the log scanned too."""
    suite = run.suite
    steps: list[tuple[str, object, Callable[[], tuple[Status, str, str]]]] = [
        ("kv pool", suite.kv_pool, lambda: _kv_pool(run)),
        ("block cost", suite.block_cost, lambda: _block_cost(run)),
        ("needles", suite.needles, lambda: _needles(run)),
        ("tool call", suite.tool_call, lambda: _tool_call(run)),
        ("questions", suite.questions, lambda: _questions(run)),
        ("parallel", suite.parallel, lambda: _parallel(run)),
        ("ceiling", suite.ceiling, lambda: _ceiling(run)),
    ]
    if log_scan:
        steps.append(("log scan", suite.log_patterns, lambda: _log_scan(run)))
    for name, configured, measure in steps:
        if not configured:
            run.skip(name)
            continue
        if run.record(name, measure).failed and fail_fast:
            break
    run.finish()


def _kv_pool(run: Run) -> tuple[Status, str, str]:
    assert run.suite.kv_pool is not None
    pool = kv_pool_from_log(run.read_log())
    if pool is not None:
        run.note(kv_pool_tokens=pool.tokens, max_concurrency=pool.concurrency, concurrency_tokens=pool.request_tokens)
    return judge_kv_pool(pool, run.suite.kv_pool, run.baseline_pool)


def _block_cost(run: Run) -> tuple[Status, str, str]:
    check = run.suite.block_cost
    assert check is not None
    before = run.server.metrics()
    geometry = before.cache_geometry
    if geometry is None:
        return Status.FAIL, "no vllm:cache_config_info", "/metrics does not say num_gpu_blocks and block_size"
    cost = None
    # Sampling can miss a short request (seen on a fresh CPU server); a second request before failing.
    for attempt in range(2):
        timing, samples = _sampled_request(run, check.prompt_tokens, check.max_tokens, f"block-cost-{attempt}")
        run.timings.append(timing)
        cost = block_cost(timing.prompt_tokens + timing.completion_tokens, samples, geometry, before.kv_usage or 0.0)
        if cost.held:
            break
    assert cost is not None
    run.note(tokens_per_block=cost.tokens_per_block if cost.held else None, blocks_ratio=cost.ratio)
    return judge_block_cost(cost, check)


def _sampled_request(run: Run, prompt_tokens: int, max_tokens: int, label: str) -> tuple[Timing, list[float]]:
    """One request alone while kv_cache_usage_perc is read at every streamed token (one per engine step: the
    request holds its blocks then) and by the watchdog a few times a second."""
    prompt = run.server.filler(prompt_tokens, f"{label}-{time.time_ns()}")
    samples: list[float] = []
    first = len(run.watch.readings)

    def request(tick: Tick) -> Timing:
        def on_token() -> None:
            tick()
            reading = run.watch.sample()
            if reading is not None and reading.kv_usage is not None:
                samples.append(reading.kv_usage)
        return run.server.complete(prompt, max_tokens=max_tokens, on_token=on_token)

    timing = run.watch.call(request)
    samples += [r.kv_usage for r in run.watch.readings[first:] if r.kv_usage is not None]
    return timing, samples


def _chat(run: Run, messages: list[dict[str, str]], max_tokens: int,
          extra: dict[str, Any] | None = None) -> tuple[StreamedChat, Timing]:
    """One streamed chat under the stall watchdog."""
    def request(tick: Tick) -> tuple[StreamedChat, Timing]:
        chat, timing, _raw = run.server.chat(messages, max_tokens=max_tokens, extra=extra, on_token=tick)
        return chat, timing
    return run.watch.call(request)


def _completion(run: Run, prompt: str | list[int], max_tokens: int) -> Callable[[Tick], Timing]:
    def request(tick: Tick) -> Timing:
        return run.server.complete(prompt, max_tokens=max_tokens, on_token=tick)
    return request


def needle_code(length: int) -> str:
    return f"{(length * 7919) % 9000 + 1000}-{chr(65 + length % 26)}{chr(65 + (length // 26) % 26)}"


def _needles(run: Run) -> tuple[Status, str, str]:
    check: NeedleCheck | None = run.suite.needles
    assert check is not None
    found, misses = 0, []
    for length in check.lengths:
        code = needle_code(length)
        half = run.server.filler(length // 2, f"needle-a-{length}")
        rest = run.server.filler(length - length // 2, f"needle-b-{length}")
        text = f"{half}The access code for the north gate is {code}.\n{rest}"
        question = "What is the access code for the north gate? Answer with the code only."
        chat, timing = _chat(run, [{"role": "user", "content": text + "\n" + question}], check.max_tokens)
        run.timings.append(timing)
        if code in chat.text:
            found += 1
        else:
            misses.append(f"{timing.prompt_tokens:,} tokens: {chat.text.strip()[:60]!r}")
    minimum = len(check.lengths) if check.min_found is None else check.min_found
    run.note(needles_found=f"{found}/{len(check.lengths)}")
    status, figure, detail = judge_count("needles found", found, len(check.lengths), minimum)
    return status, figure, detail + ("; missed at " + "; ".join(misses) if misses and detail else "")


def _tool_call(run: Run) -> tuple[Status, str, str]:
    assert run.suite.tool_call is not None
    messages = [{"role": "user", "content": "What is the weather in Paris right now? Use the tool."}]
    extra = {"tools": [WEATHER_TOOL], "tool_choice": "auto", **run.suite.tool_call.extra}
    chat, timing = _chat(run, messages, 128, extra)
    run.timings.append(timing)
    return judge_tool_call(chat)


def _questions(run: Run) -> tuple[Status, str, str]:
    check: QuestionCheck | None = run.suite.questions
    assert check is not None
    right = 0
    for q in check.questions:
        chat, timing = _chat(run, [{"role": "user", "content": q.ask}], check.max_tokens)
        run.timings.append(timing)
        right += answer_is_right(chat.text, q.expect)
    run.note(questions_right=f"{right}/{len(check.questions)}")
    return judge_count("questions right", right, len(check.questions), check.min_right)


def _parallel(run: Run) -> tuple[Status, str, str]:
    check = run.suite.parallel
    assert check is not None
    prompts = [run.server.filler(check.prompt_tokens, f"parallel-{i}-{time.time_ns()}") for i in range(check.requests)]
    before = run.server.metrics().preemptions or 0.0

    # Daemon threads under the watch: on a stall or Ctrl-C the rollback does not wait for them.
    timings = run.watch.gather([_completion(run, p, check.max_tokens) for p in prompts], errors_as_values=True)
    preemptions = int((run.server.metrics().preemptions or 0.0) - before)
    run.note(preemptions=preemptions)
    return judge_parallel(timings, preemptions, check)


def _ceiling(run: Run) -> tuple[Status, str, str]:
    """One request of exactly max_model_len - max_tokens prompt tokens (token ids, so the size is exact):
    the largest the frontend accepts. Where the pool holds less, a livelocked engine sends no token and the
    watchdog fails the check in stall_s."""
    check = run.suite.ceiling
    assert check is not None
    geometry = run.server.metrics().cache_geometry
    if geometry is None:
        return Status.ERROR, "no vllm:cache_config_info", "/metrics does not say num_gpu_blocks and block_size"
    max_model_len = run.server.max_model_len
    prompt = run.server.token_ids(max_model_len - check.max_tokens, f"ceiling-{time.time_ns()}")
    timing = run.watch.call(_completion(run, prompt, check.max_tokens))
    run.timings.append(timing)
    waiting = None
    for _ in range(20):  # the gauges follow the engine's step; give them a moment to settle
        waiting = run.server.metrics().total("vllm:num_requests_waiting")
        if not waiting:
            break
        time.sleep(0.1)
    return judge_ceiling(timing, waiting, max_model_len, geometry)


def scan_log(run: Run) -> CheckResult:
    """The log scan as a check of its own (recorded in `run`), run after everything else sent its requests."""
    if not run.suite.log_patterns:
        run.skip("log scan")
        return run.results[-1]
    return run.record("log scan", lambda: _log_scan(run))


def _log_scan(run: Run) -> tuple[Status, str, str]:
    findings = log_findings(run.read_log(), run.suite.log_patterns)
    run.note(log_findings=sum(f.count for f in findings))
    return judge_log(findings)
