"""Why a container died (one rule for serve and deploy), and the liveness rule's pieces on recorded /metrics."""

from __future__ import annotations

import json
from pathlib import Path

from vpatch.serve import alive
from vpatch.serve.health import why_it_died

DATA = Path(__file__).parents[1] / "data" / "deploy"


def test_the_line_that_says_why_a_container_died() -> None:
    log = ("INFO loading\nValueError: To serve at least one request with the model's max seq len (1024), "
           "(1.0 MiB KV cache is needed, ...)\nINFO shutting down\n")
    assert why_it_died(log).startswith("ValueError: To serve at least one request")
    assert why_it_died("only\nplain\n") == "plain" and why_it_died("") == "(no output)"
    # Recorded: vLLM 0.32.0 (CPU) refusing a KV budget below max-model-len; the last exception only points up.
    real = (DATA / "cpu-kv-too-small.log").read_text()
    assert "See root cause above" in real
    assert why_it_died(real).startswith("ValueError: To serve at least one request with the model's max seq len (1024)")


def test_the_root_cause_comes_first_not_last() -> None:
    """What tells the two old rules apart: a chained traceback whose wrapper is not a known pointer phrase.
    Python prints the root cause first; the last exception (deploy's old rule) is only the wrapper, and an
    exception named mid-line in an INFO line is no exception line (serve's old rule, kept, anchors lines)."""
    log = ("(APIServer pid=1) INFO retrying after ConnectionError: refused\n"
           "Traceback (most recent call last):\n  File \"x.py\", line 1\n"
           "(EngineCore pid=7) ERROR 11-30 04:22:36 [core.py:1] ValueError: No available memory for the cache blocks\n"
           "\nThe above exception was the direct cause of the following exception:\n\n"
           "Traceback (most recent call last):\n  File \"y.py\", line 2\n"
           "RuntimeError: Engine process failed to start\n")
    assert why_it_died(log) == "ValueError: No available memory for the cache blocks"


def test_counters_from_recorded_metrics_and_the_stall_memory(tmp_path: Path) -> None:
    text = (DATA / "cpu-metrics.txt").read_text()
    now = alive.Counters.parse(text, at=1000.0)
    assert (now.running, now.waiting) == (0.0, 0.0) and now.outstanding == 0
    busy = alive.Counters(1000.0, running=0, waiting=1, generated=9, prompted=1000, preemptions=1)
    later = alive.Counters(1040.0, running=0, waiting=1, generated=10, prompted=1001, preemptions=1)
    # The previous check's record: one request waiting then and now, and only the probe's own 2 tokens since.
    record = {"counters": busy.__dict__, "stalled_since": None}
    assert alive.stalled_since(later, record, own_tokens=2) == 1000.0
    assert alive.stalled_since(later, record, own_tokens=1) is None  # one foreign token: it moves
    idle = alive.Counters(1040.0, running=0, waiting=0, generated=10, prompted=1001, preemptions=1)
    assert alive.stalled_since(idle, record, own_tokens=0) is None  # nothing outstanding
    state = tmp_path / "alive.json"
    alive.save_state(str(state), {"counters": busy.__dict__, "stalled_since": 990.0})
    assert json.loads(state.read_text())["stalled_since"] == 990.0


def test_a_server_that_does_not_answer_is_down_at_once() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: refused
    verdict = alive.check(f"http://127.0.0.1:{port}", timeout=2)
    assert verdict.state == "down" and not verdict.alive and "did not answer" in verdict.detail
    assert alive.main([f"http://127.0.0.1:{port}", "--timeout", "2"]) == 1
