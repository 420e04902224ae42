"""The check suite's parsing and judging, on start logs, /metrics scrapes and streams as vLLM writes them."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from vpatch.base.errors import ConfigError
from vpatch.config.deploy import BlockCostCheck, KvPoolCheck, ParallelCheck, Suite
from vpatch.deploy.client import Server, Timing
from vpatch.deploy.judge import (
    CheckResult,
    CheckStatus,
    answer_is_right,
    ceiling_tokens,
    judge_block_cost,
    judge_ceiling,
    judge_count,
    judge_kv_pool,
    judge_log,
    judge_parallel,
    judge_tool_call,
)
from vpatch.deploy.measure import Run, run_checks
from vpatch.deploy.readings import (
    CacheGeometry,
    KvPool,
    Metrics,
    NotStrictJson,
    assemble_chat,
    block_cost,
    kv_pool_from_log,
    log_findings,
    sse_events,
    strict_json,
)

GPU_LOG = """\
(EngineCore_DP0 pid=311) INFO 09-24 20:11:07 [kv_cache_utils.py:1087] GPU KV cache size: 1,050,422 tokens
(EngineCore_DP0 pid=311) INFO 09-24 20:11:07 [kv_cache_utils.py:1091] Maximum concurrency for 220,000 tokens per request: 4.77x
"""
CPU_LOG = "INFO [kv_cache_utils.py:1087] CPU KV cache size: 2,048 tokens, Maximum concurrency for 1,024 tokens per request: 2.00x\n"


def test_kv_pool_is_read_in_gpu_and_cpu_wording() -> None:
    assert kv_pool_from_log(GPU_LOG) == KvPool(tokens=1_050_422, request_tokens=220_000, concurrency=4.77)
    assert kv_pool_from_log(CPU_LOG) == KvPool(tokens=2048, request_tokens=1024, concurrency=2.0)
    assert kv_pool_from_log("INFO loading weights\n") is None


def test_kv_pool_judged_against_floor_and_baseline() -> None:
    check = KvPoolCheck(min_tokens=1_000_000, max_drop=0.05)
    pool = kv_pool_from_log(GPU_LOG)
    assert judge_kv_pool(pool, check, KvPool(1_041_901))[0] is CheckStatus.PASS
    # The write-up's "lower the budget by a gigabyte" pool: about 900,000 tokens is under the floor.
    status, figure, detail = judge_kv_pool(KvPool(900_000), check, KvPool(1_041_901))
    assert status is CheckStatus.FAIL and "900,000" in figure and "below the floor" in detail and "shrank" in detail
    assert judge_kv_pool(None, check, None)[0] is CheckStatus.FAIL


METRICS = """\
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="flash"} 0.2028
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="flash"} 3.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="800",cache_dtype="fp8",engine="0",num_gpu_blocks="1356",prefix_caching_hash_algo="sha256"} 1.0
"""


def test_metrics_give_usage_preemptions_and_geometry() -> None:
    metrics = Metrics.parse(METRICS)
    assert metrics.kv_usage == pytest.approx(0.2028)
    assert metrics.preemptions == 3
    assert metrics.cache_geometry == CacheGeometry(blocks=1356, block_size=800)
    assert Metrics.parse("# nothing\n").kv_usage is None


def test_the_mamba_leak_fails_the_block_cost_check_and_the_fixed_build_passes() -> None:
    geometry = CacheGeometry(blocks=1356, block_size=800)
    check = BlockCostCheck(prompt_tokens=84_495)
    # The write-up: 84,495 tokens held 275 blocks where the geometry calls for 111 (1 per 308 tokens).
    leak = block_cost(84_495, [0.0, 0.1, 275 / 1356, 0.05], geometry)
    assert (leak.held, leak.predicted) == (275, 106)
    status, figure, _ = judge_block_cost(leak, check)
    assert status is CheckStatus.FAIL and "1 per 307 tokens" in figure
    # After the fix: 1 block per roughly 710 tokens.
    fixed = block_cost(84_495, [119 / 1356], geometry)
    assert judge_block_cost(fixed, check)[0] is CheckStatus.PASS
    # Nothing seen is no pass: an error of the measurement, which fails the deploy like a failed check.
    unseen = judge_block_cost(block_cost(84_495, [], geometry), check)
    assert unseen[0] is CheckStatus.ERROR and "measurement error" in unseen[2]
    assert CheckResult("block cost", unseen[0], unseen[1], unseen[2]).failed
    # A stream cut short carries no usage: blocks seen for 0 tokens is no leak (seen when the docker daemon
    # stopped mid-request: "6 blocks for 0 tokens ... infx ... holds more KV blocks than ... assumes").
    cut = judge_block_cost(block_cost(0, [6 / 1356], geometry), check)
    assert cut[0] is CheckStatus.ERROR and "ended without its usage" in cut[2] and "inf" not in cut[1]


def _stream(*deltas: dict[str, object]) -> list[str]:
    events = [{"choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    return [f"data: {json.dumps(e)}\n" for e in events] + ["data: [DONE]\n"]


def _call(index: int, name: str | None, args: str) -> dict[str, object]:
    function: dict[str, str] = {"arguments": args}
    if name:
        function["name"] = name
    return {"tool_calls": [{"index": index, "id": f"c{index}", "type": "function", "function": function}]}


def test_streamed_tool_call_fragments_assemble_and_must_be_strict_json() -> None:
    good = assemble_chat(sse_events(_stream(_call(0, "get_weather", ""), _call(0, None, '{"city": '),
                                            _call(0, None, '"Paris"}'))))
    assert good.tool_calls[0].arguments == '{"city": "Paris"}'
    assert judge_tool_call(good)[0] is CheckStatus.PASS
    # Python's json takes NaN; a strict client does not, and neither does this check.
    nan = assemble_chat(sse_events(_stream(_call(0, "get_weather", '{"temp": Na'), _call(0, None, "N}"))))
    status, figure, _ = judge_tool_call(nan)
    assert status is CheckStatus.FAIL and "not strict JSON" in figure
    broken = assemble_chat(sse_events(_stream(_call(0, "get_weather", '{"city": "Par'))))
    assert judge_tool_call(broken)[0] is CheckStatus.FAIL
    assert judge_tool_call(assemble_chat(sse_events(_stream({"content": "It is sunny."}))))[0] is CheckStatus.FAIL
    with pytest.raises(NotStrictJson):
        strict_json('{"x": -Infinity}')


def test_questions_and_needles_count_right_answers() -> None:
    assert answer_is_right("The answer is 391.", ["391"])
    assert not answer_is_right("It is 392", ["391", "three hundred ninety-one"])
    assert not answer_is_right("use the tools", ["ls"]) and answer_is_right("Run `ls -la`.", ["ls"])
    assert answer_is_right("Canberra.", ["canberra"]) and not answer_is_right("16", ["6"])
    assert judge_count("questions right", 18, 21, 18)[0] is CheckStatus.PASS
    status, figure, _ = judge_count("questions right", 0, 21, 18)
    assert status is CheckStatus.FAIL and figure == "0 of 21 questions right (min 18)"


def test_parallel_fails_on_preemptions_errors_and_early_stops() -> None:
    check = ParallelCheck(requests=4, prompt_tokens=900, max_tokens=16)
    ok = [Timing(0.5, 2.0, 900, 16)] * 4
    assert judge_parallel(ok, 0, check)[0] is CheckStatus.PASS
    status, figure, detail = judge_parallel(ok, 7, check)
    assert status is CheckStatus.FAIL and "7 preemption(s)" in figure and "cannot hold 4 requests" in detail
    assert judge_parallel([*ok[:3], "HTTP 500"], 0, check)[0] is CheckStatus.FAIL
    assert judge_parallel([*ok[:3], Timing(0.5, 2.0, 900, 3)], 0, check)[0] is CheckStatus.FAIL


def test_log_scan_finds_patterns_case_insensitively_with_counts() -> None:
    log = "INFO ok\nWARNING [gpu_worker.py] memory allocation failed for 205 MB\nwarning: Memory allocation failed\n"
    findings = log_findings(log, ["memory allocation failed", "Traceback"])
    assert [(f.pattern, f.count) for f in findings] == [("memory allocation failed", 2)]
    status, figure, _ = judge_log(findings)
    assert status is CheckStatus.FAIL and "x2" in figure
    assert judge_log(log_findings("INFO fine\n", ["Traceback"]))[0] is CheckStatus.PASS


def test_suite_parses_thresholds_and_refuses_bad_values(tmp_path: Path) -> None:
    (tmp_path / "q.yaml").write_text("- {ask: 'What is 17 * 23?', expect: 391}\n- {ask: 'Capital of France?', expect: [Paris]}\n")
    data = {"checks": {"kv_pool": {"min_tokens": 2048}, "questions": {"file": "q.yaml", "min_right": 1},
                       "parallel": {"requests": 4, "prompt_tokens": 900}, "needles": {"lengths": [500], "min_found": 0}},
            "hooks": {"before_switch": [["true"]]}}
    suite = Suite.parse(data, root=tmp_path, source="images/t.yaml")
    assert suite.kv_pool == KvPoolCheck(2048) and suite.block_cost is None
    assert suite.questions is not None and suite.questions.questions[0].expect == ("391",)
    assert suite.hooks.before_switch == (("true",),)
    for bad, key in [({"checks": {"parallel": {"requests": 0, "prompt_tokens": 9}}}, "parallel.requests"),
                     ({"checks": {"questions": {"file": "q.yaml", "min_right": 3}}}, "min_right"),
                     ({"checks": {"kv_poll": {}}}, "kv_poll"),
                     ({"hooks": {"before_switch": ["curl x"]}}, "before_switch[0]")]:
        with pytest.raises(ConfigError, match=key.replace("[", r"\[")):
            Suite.parse(bad, root=tmp_path, source="images/t.yaml")


DATA = Path(__file__).parents[1] / "data" / "deploy"


def test_recorded_cpu_server_start_log_metrics_and_tool_call_stream() -> None:
    """Recorded from the real vLLM 0.32.0 CPU server (tiny Qwen3, 4 MiB KV budget, hermes tool parser)."""
    assert kv_pool_from_log((DATA / "cpu-start.log").read_text()) == KvPool(8192, 1024, 8.0)
    metrics = Metrics.parse((DATA / "cpu-metrics.txt").read_text())
    assert metrics.cache_geometry == CacheGeometry(blocks=64, block_size=128)
    assert (metrics.kv_usage, metrics.preemptions) == (0.0, 0.0)
    # A tool call forced by a structured_outputs regex, streamed through the hermes parser in fragments.
    chat = assemble_chat(sse_events((DATA / "cpu-toolcall.sse").read_text().splitlines()))
    assert [(c.name, c.arguments) for c in chat.tool_calls] == [("get_weather", '{"city": "Paris"}')]
    assert chat.finish_reason == "tool_calls" and judge_tool_call(chat)[0] is CheckStatus.PASS


def test_the_ceiling_is_the_pool_without_its_null_block_or_max_model_len() -> None:
    """One-block-short: the startup check sizes against all N blocks, BlockPool keeps one back."""
    minimum = CacheGeometry(blocks=8, block_size=128)  # 1,024 tokens: exactly one max-model-len request
    assert ceiling_tokens(1024, minimum) == 896
    assert ceiling_tokens(1024, CacheGeometry(blocks=64, block_size=128)) == 1024
    done = Timing(0.5, 1.0, 1008, 16, "length")
    assert judge_ceiling(done, 0.0, 1024, CacheGeometry(64, 128))[0] is CheckStatus.PASS
    status, figure, detail = judge_ceiling(done, 1.0, 1024, minimum)
    assert status is CheckStatus.FAIL and "left waiting" in detail and "896 usable" in figure
    aborted = Timing(0.5, 1.0, 1008, 0, None)
    assert judge_ceiling(aborted, 0.0, 1024, minimum)[0] is CheckStatus.FAIL


def test_stall_s_and_the_ceiling_check_are_read_from_the_suite(tmp_path: Path) -> None:
    suite = Suite.parse({"stall_s": 12, "checks": {"ceiling": {"max_tokens": 8}}}, root=tmp_path, source="images/x.yaml")
    assert suite.stall_s == 12.0 and suite.ceiling is not None and suite.ceiling.max_tokens == 8
    default = Suite.parse({"start_watch_s": 20}, root=tmp_path, source="images/x.yaml")  # deploy: {} is an error
    assert default.stall_s == 30.0 and default.ceiling is None
    with pytest.raises(ConfigError, match="stall_s"):
        Suite.parse({"stall_s": 0}, root=tmp_path, source="images/x.yaml")


def test_a_hook_whose_program_is_missing_is_named_before_switch_stops_and_after_switch_reports() -> None:
    """Audit rows R19 and X41 at the layer that decides them (the real-server deploy with a failing hook is
    test_deploy_switch's): a before_switch hook that cannot start stops the deploy naming the program; a
    failing after_switch hook is returned to be reported, and the hooks after it still run."""
    from vpatch.base import VpatchError
    from vpatch.deploy import switch

    said: list[str] = []
    with pytest.raises(VpatchError) as caught:
        switch.run_hooks([["/nonexistent/lane-divert", "flash", "standby"]], "before_switch", said.append, strict=True)
    assert caught.value.message.startswith("before_switch hook failed: ") and "/nonexistent/lane-divert" in caught.value.message
    assert caught.value.hint and "nothing was switched" in caught.value.hint
    assert said == ["before_switch: /nonexistent/lane-divert flash standby"]
    failed = switch.run_hooks([["false"], ["/nonexistent/notify"], ["true"]], "after_switch", said.append, strict=False)
    assert len(failed) == 2 and "/nonexistent/notify" in failed[1]
    assert said[-1] == "after_switch: true"  # the hooks after a failed one still ran


class _StarvedFrontend(Server):
    """The block-cost retries, whose trigger is a timing race the real server loses only under load (a 2-core
    machine at load 4-5: its frontend set kv_cache_usage_perc only after the engine had freed the request's
    blocks). A real server cannot be made to lose that race on demand, so this one answers from the recorded
    CPU server's /metrics with two numbers scripted: the gauge stays at 0 for the first `missed` requests, and
    the engine's stepped tokens count each request's prompt and tokens as vLLM counts them."""

    def __init__(self, missed: int, others: int = 0) -> None:
        super().__init__("http://127.0.0.1:9")  # never opened: every answer below is scripted
        self.missed = missed
        self.others = others  # tokens of other requests (the container's health checks) stepped per token
        self.kv, self.stepped = 0.0, 0.0
        self.requests: list[int] = []  # max_tokens of each completion, in order
        self._text = (DATA / "cpu-metrics.txt").read_text()

    def metrics(self, *, timeout: float = 10.0) -> Metrics:
        text = self._text.replace('vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.0',
                                  f'vllm:kv_cache_usage_perc{{engine="0",model_name="tiny"}} {self.kv}')
        return Metrics.parse(text.replace('vllm:iteration_tokens_total_sum{engine="0",model_name="tiny"} 0.0',
                                          f'vllm:iteration_tokens_total_sum{{engine="0",model_name="tiny"}} {self.stepped}'))

    @property
    def max_model_len(self) -> int:
        return 1024

    def filler(self, tokens: int, nonce: str) -> str:
        return nonce

    def complete(self, prompt: str | list[int], *, max_tokens: int, extra: Mapping[str, Any] | None = None,
                 on_token: Callable[[], None] | None = None) -> Timing:
        self.requests.append(max_tokens)
        seen = len(self.requests) > self.missed
        self.stepped += 800  # the prefill
        for n in range(1, max_tokens + 1):
            self.stepped += 1 + self.others
            if seen:
                self.kv = -(-(800 + n) // 128) / 64  # the blocks of 800 + n tokens, of 64
            if on_token is not None:
                on_token()
            if seen:  # a token takes a while: the check's own sampling thread reads meanwhile (no need unseen)
                time.sleep(0.005)
        self.kv = 0.0  # the request ended: its blocks are free
        return Timing(0.1, 0.5, 800, max_tokens, "length")


def _block_cost_run(server: Server, tmp_path: Path) -> Run:
    suite = Suite.parse({"checks": {"block_cost": {"prompt_tokens": 800, "max_tokens": 32}}},
                        root=tmp_path, source="images/x.yaml")
    run = Run(server, suite, read_log=lambda: "", progress=lambda _: None)
    run_checks(run, fail_fast=True, log_scan=False)
    return run


def test_a_missed_block_cost_request_is_retried_longer_and_judged_by_its_own_tokens(tmp_path: Path) -> None:
    server = _StarvedFrontend(missed=1)
    run = _block_cost_run(server, tmp_path)
    (result,) = [r for r in run.results if r.name == "block cost"]
    assert result.status is CheckStatus.PASS, result
    # The retry decodes as long as max-model-len allows: 1,024 - 800 - 16 = 208 tokens, not 8 x 32.
    assert server.requests == [32, 208]
    assert "8 blocks for 1,008 tokens" in result.figure
    points = run.series.block_cost
    assert points and max(p.held for p in points) == 8
    # The plot's prediction counts the retry's own tokens (1,008: 8 blocks), not the missed request's 832 too
    # (15 blocks: the CI failure of df21745's parent).
    assert max(p.predicted for p in points if p.predicted is not None) == 8


def test_the_prediction_counts_the_requests_own_tokens_not_the_health_checks_stepped_beside_it(tmp_path: Path) -> None:
    """The engine's stepped-token counter also counts the container's own 1-token health checks: 5 more per
    token here. The prediction follows the request's own prompt and streamed tokens: 832 tokens, 7 blocks."""
    server = _StarvedFrontend(missed=0, others=5)
    points = _block_cost_run(server, tmp_path).series.block_cost
    predicted = [p.predicted for p in points if p.predicted is not None]
    assert predicted and max(predicted) == 7 == max(p.held for p in points), points


def test_a_gauge_that_never_moves_is_a_measurement_error_after_twelve_requests(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    pauses: list[float] = []  # the check's own pauses (the watchdog's quarter seconds still sleep)
    real_sleep = time.sleep
    monkeypatch.setattr(time, "sleep", lambda s: pauses.append(s) if s >= 1 else real_sleep(s))
    server = _StarvedFrontend(missed=12)
    (result,) = [r for r in _block_cost_run(server, tmp_path).results if r.name == "block cost"]
    assert server.requests == [32] + [208] * 11
    assert pauses == [1, 2, 3, 4, 4, 4, 4, 4, 4, 4]  # from the third request on: a burst of load can pass, 38 s at most
    assert result.status is CheckStatus.ERROR and "measurement error" in result.detail and result.failed


class _Burst(_StarvedFrontend):
    """A server whose whole answer reaches the client in one read: every token event at the same instant."""

    def complete(self, prompt: str | list[int], *, max_tokens: int, extra: Mapping[str, Any] | None = None,
                 on_token: Callable[[], None] | None = None) -> Timing:
        for _ in range(max_tokens):
            if on_token is not None:
                on_token()
        return Timing(0.1, 0.1001, 800, max_tokens, "length")


def test_the_timing_check_repeats_and_keeps_decode_rates_only_from_spaced_tokens(tmp_path: Path) -> None:
    suite = Suite.parse({"checks": {"timing": {"repeats": 3, "prompt_tokens": 64, "max_tokens": 32, "parallel": 2,
                                               "long_prompt_tokens": 600}}}, root=tmp_path, source="images/x.yaml")
    for server, decoded in ((_StarvedFrontend(missed=0), 3), (_Burst(missed=0), 0)):
        run = Run(server, suite, read_log=lambda: "", progress=lambda _: None)
        run_checks(run, fail_fast=True, log_scan=False)
        (timing,) = [r for r in run.results if r.name == "timing"]
        assert timing.status is CheckStatus.PASS and "(3 repeats)" in timing.figure, timing
        f = run.figures
        assert len(f.ttft_samples or ()) == 3 == len(f.prefill_samples or ()) == len(f.makespan_samples or ())
        assert len(f.decode_samples or ()) == decoded  # a burst (310,000 tok/s) is no decode rate
        assert f.decode_bursts == 3 - decoded  # and is counted, so the report can say why the rate is missing
        assert f.timing_load is not None and f.timing_min_change == 0.1 and f.timing_cores == os.cpu_count()
        assert (f.timing_stall is not None and 0 <= f.timing_stall <= 1) == Path("/proc/pressure/cpu").exists()
