"""Progress on stderr: plain lines off a terminal (a running byte count only now and then), a live
display on one that leaves one line per finished piece of work."""

from __future__ import annotations

import io

import pytest

from vpatch.base.progress import Event
from vpatch.report.console import ProgressView


def test_plain_lines_show_each_step_and_the_end_but_not_every_chunk() -> None:
    out = io.StringIO()
    with ProgressView(out, live=False) as view:
        view(Event("vllm 1.0.0", "downloading"))
        for done in range(1, 50):
            view(Event("vllm 1.0.0", "downloading", "vllm-1.0.0.tar.gz", done=done * 1_000_000, total=50_000_000))
        view(Event("vllm 1.0.0", "downloaded", "vllm-1.0.0.tar.gz (50.0 MB)", done=50_000_000, final=True,
                   seconds=2.0))

    assert out.getvalue().splitlines() == [
        "vllm 1.0.0: downloading",
        "vllm 1.0.0: downloaded vllm-1.0.0.tar.gz (50.0 MB) (2.0s)",
    ]


def test_the_live_display_leaves_one_line_per_finished_subject() -> None:
    out = io.StringIO()
    with ProgressView(out, live=True) as view:
        view(Event("probe venv", "creating the venv"))
        view(Event("probe 0002 on v0.30.0", "running"))
        view(Event("probe 0002 on v0.30.0", "pass", final=True, seconds=61.5))
        view(Event("probe venv", "ready", "abc (1.30 GB)", final=True, seconds=240.0))

    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    assert lines[-2:] == ["probe 0002 on v0.30.0: pass (61.5s)", "probe venv: ready abc (1.30 GB) (240.0s)"]


def test_a_long_command_ends_with_each_phase_s_time_in_the_order_they_began(monkeypatch: pytest.MonkeyPatch) -> None:
    from vpatch.report import console

    now = [0.0]
    monkeypatch.setattr(console.time, "monotonic", lambda: now[0])
    out = io.StringIO()
    events = [
        (1.0, Event("vllm 0.30.0", "downloading")),
        (2.0, Event("probe venv", "creating the venv")),
        (3.0, Event("vllm 0.31.0", "downloading")),
        (9.0, Event("probe venv", "ready", final=True, seconds=7.0)),
        (12.0, Event("vllm 0.30.0", "downloaded", final=True)),
        (14.0, Event("vllm 0.30.0", "committed", final=True)),  # a subject that ends twice counts once
        (30.0, Event("vllm 0.31.0", "committed", final=True)),
        (31.0, Event("upstream tests of 0003 on v0.30.0", "running")),  # never ended: no phase line of its own
    ]
    with ProgressView(out, live=False, phases=True) as view:
        for at, event in events:
            now[0] = at
            view(event)
        now[0] = 40.0

    assert out.getvalue().splitlines()[-1] == "time by phase (they overlap): vllm 29.0s (2), probe venv 7.0s; in all 40.0s"


def test_a_short_command_ends_without_the_phases(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    with ProgressView(out, live=False, phases=True) as view:
        view(Event("probe venv", "ready", final=True, seconds=0.1))

    assert out.getvalue().splitlines() == ["probe venv: ready (0.1s)"]
