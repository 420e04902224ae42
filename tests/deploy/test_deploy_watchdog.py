"""The stall watchdog's rule and the deploy's signal handling, without a server (the real-server cases are in
test_deploy_switch.py: a SIGSTOPped engine core, and Ctrl-C under an inherited SIGINT ignore)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from vpatch.deploy.client import Server
from vpatch.deploy.readings import Metrics
from vpatch.deploy.watchdog import Reading, Stalled, Tick, Watchdog


def _nowhere() -> Server:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: /metrics is refused
    return Server(f"http://127.0.0.1:{port}")


def test_a_request_with_no_token_for_stall_s_fails_at_once_not_at_its_timeout() -> None:
    watch = Watchdog(_nowhere(), stall_s=1.0)
    release = threading.Event()

    def hung(_tick: Tick) -> str:
        release.wait(30)  # the request timeout the watchdog must not wait for
        return "late"

    began = time.monotonic()
    with pytest.raises(Stalled, match=r"1 request\(s\), no token for 1s \(stall_s 1\); metrics unreadable"):
        watch.call(hung)
    assert time.monotonic() - began < 5
    release.set()


def test_a_request_that_keeps_streaming_is_never_stalled() -> None:
    watch = Watchdog(_nowhere(), stall_s=0.5)

    def streaming(tick: Tick) -> int:
        for _ in range(15):
            time.sleep(0.1)
            tick()
        return 15

    assert watch.call(streaming) == 15
    # In parallel: one queued request quiet for longer than stall_s while another streams is not a stall.
    quiet_then_done = threading.Event()

    def queued(_tick: Tick) -> int:
        quiet_then_done.wait(1.2)
        return 0

    assert watch.gather([streaming, queued]) == [15, 0]


def test_metrics_that_move_excuse_a_quiet_stream_and_frozen_ones_do_not() -> None:
    watch = Watchdog(_nowhere(), stall_s=1.0)
    now = time.monotonic()
    watch._last_token[0] = now - 5
    text = 'vllm:num_requests_running{engine="0"} 1.0\nvllm:num_requests_waiting{engine="0"} 0.0\n'

    def reading(at: float, work: float) -> Reading:
        metrics = Metrics.parse(text + f'vllm:iteration_tokens_total_sum{{engine="0"}} {work}\n')
        return Reading.of(metrics, at)

    watch.readings[:] = [reading(now - 4, 100.0), reading(now - 1, 2148.0)]  # a long prefill's chunks
    assert watch.stalled(now) is None
    watch.readings[:] = [reading(now - 4, 100.0), reading(now - 1, 100.0)]
    why = watch.stalled(now)
    assert why == ("1 request(s), no token for 5s (stall_s 1); metrics: 1 running, 0 waiting, counters unchanged "
                   "for 5s: the engine is stalled")


CHILD = r"""
import os, signal, sys, time
from vpatch.base import interruptible
assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # inherited, as a shell's background job has it
try:
    with interruptible():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    print("ignored")
except KeyboardInterrupt:
    # One interrupt is enough: a second one during the rollback is ignored.
    print("interrupted", signal.getsignal(signal.SIGINT) is signal.SIG_IGN)
"""


def test_ctrl_c_interrupts_a_deploy_even_when_the_process_inherited_sigint_ignored() -> None:
    """The lost Ctrl-C: a shell starts background jobs with SIGINT ignored, Python then installs no handler,
    and the deploy ran on to "deployed". interruptible() takes SIGINT (and SIGTERM) whatever was inherited."""
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert done.stdout.split() == ["interrupted", "True"], done.stderr
