"""Progress on stderr: plain lines off a terminal (a running byte count only now and then), a live
display on one that leaves one line per finished piece of work."""

from __future__ import annotations

import io

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
