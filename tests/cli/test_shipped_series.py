"""The shipped series on the real vLLM release history: every probe is validated on v0.29.0 and
tells the releases that have the fix from those that do not."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REAL_CACHE

from vpatch.probes import file as probe_file
from vpatch.probes import runner as probes
from vpatch.probes.runner import ProbeOutcome
from vpatch.series.files import Patch, Series

pytestmark = pytest.mark.releases

PATCHES = Path(__file__).resolve().parents[2] / "patches"
PIN = "v0.29.0"
RELEASES = ["v0.28.0", "v0.29.0", "v0.30.0", "v0.31.0", "v0.32.0", "v0.33.0"]
# The first release whose unpatched tree has each fix (upstream wrote 0002 differently); None: none of them.
# 0003: v0.33.0 has upstream's own transitions for four of the five cases, but on the path the server runs
# its streamed tool name keeps the newline of an unclosed <function=NAME ("get_weather\n"), so no release
# in the history has the fix.
LANDS_IN: dict[str, str | None] = {
    "0001-qsa-fp8-kv": "v0.31.0",
    "0002-mamba-null-gap-free": "v0.30.0",
    "0003-qwen3-tool-call-unclosed-function": None,
}


def shipped() -> list[Patch]:
    return list(Series.load(PATCHES))


def test_the_shipped_series_is_the_three_production_patches_each_with_a_probe() -> None:
    patches = shipped()
    assert [p.name for p in patches] == list(LANDS_IN)
    assert all(p.probe_path is not None and p.probe_path.is_file() for p in patches)


@pytest.mark.parametrize("name", list(LANDS_IN))
def test_probe_fails_on_the_pin_and_passes_with_its_patch(release_history: Path, name: str) -> None:
    # The real cache: the probe venv (CPU torch) and the results are built once per machine.
    patch = next(p for p in shipped() if p.name == name)
    validation = probes.validate_probe(release_history, None, patch, base=PIN, cache=REAL_CACHE)
    assert validation.ok
    assert (validation.base.outcome, validation.patched.outcome) == (ProbeOutcome.FAIL, ProbeOutcome.PASS)


BEFORE_THE_FILE = {"0001-qsa-fp8-kv": ("v0.28.0",)}


@pytest.mark.parametrize("name", list(LANDS_IN))
def test_probe_passes_exactly_on_the_releases_that_have_the_fix(release_history: Path, name: str) -> None:
    patch = next(p for p in shipped() if p.name == name)
    probe = probe_file.probe_for(patch)
    assert probe is not None
    got = {tag: probes.run_probe(release_history, probe, tag, cache=REAL_CACHE).outcome for tag in RELEASES}
    lands = LANDS_IN[name]
    first = RELEASES.index(lands) if lands is not None else len(RELEASES)
    want = {tag: ProbeOutcome.PASS if i >= first else ProbeOutcome.FAIL for i, tag in enumerate(RELEASES)}
    # a release older than the file the probe reads (0001's QSA model is new in v0.29.0): a missing file is no
    # evidence either way, so the probe errs there instead of failing (docs/moves.md)
    for tag in BEFORE_THE_FILE.get(name, ()):
        want[tag] = ProbeOutcome.ERROR
        assert "a missing file is no evidence either way" in probes.run_probe(release_history, probe, tag,
                                                                              cache=REAL_CACHE).detail
    assert got == want


def test_mamba_probe_prints_the_held_blocks_per_prefill_step(release_history: Path) -> None:
    probe = probe_file.probe_for(next(p for p in shipped() if p.name == "0002-mamba-null-gap-free"))
    assert probe is not None

    def held(tag: str) -> list[int]:
        detail = probes.run_probe(release_history, probe, tag, cache=REAL_CACHE).detail
        line = next(x for x in detail.splitlines() if x.startswith("held mamba blocks per prefill step:"))
        return [int(n) for n in line.split(":", 1)[1].split()]

    # 65,536 tokens in block-aligned chunks of 1,632: 40 prefill steps. The bug holds one more block
    # per step; the fix (ours on v0.29.0, upstream's from v0.30.0) stays at 3.
    assert held(PIN) == list(range(1, 41))
    assert held("v0.30.0") == [1, 2] + [3] * 38


def test_tool_call_probe_shows_what_upstreams_own_fix_does_on_the_servers_path(release_history: Path) -> None:
    # v0.33.0 closes the call in all five cases (its transitions for issue 58227), so the content and the
    # arguments arrive; but the three calls ended before their name's ">" stream the name with its newline,
    # which the old probe, stripping names, never saw. v0.32.0 has the bug in every case.
    probe = probe_file.probe_for(next(p for p in shipped() if p.name == "0003-qwen3-tool-call-unclosed-function"))
    assert probe is not None
    upstream = probes.run_probe(release_history, probe, "v0.33.0", cache=REAL_CACHE)
    assert upstream.outcome is ProbeOutcome.FAIL, upstream.detail
    assert "ok   well-formed tool call (control)" in upstream.detail
    assert ("FAIL function name left open before </tool_call>: calls [('get_weather\\n', {})], "
            "content 'It is sunny.'") in upstream.detail
    assert "ok   function body left open before the next <function=" in upstream.detail
    assert "ok   function body left open before the next <tool_call>" in upstream.detail
    assert ("FAIL: 3 of 5 malformed tool calls mishandled, 0 of 1 well-formed ones broken, on the server's path "
            "(streamed and not)") in upstream.detail
    # Upstream keeps a literal <tool_call> inside a parameter value as its text (its own tests require it).
    assert "ok   a literal <tool_call> inside a parameter value (well-formed)" in upstream.detail
    served = probes.run_probe(release_history, probe, "v0.32.0", cache=REAL_CACHE)
    assert ("FAIL function name left open before </tool_call>: calls [('get_weather\\n</tool_call>\\nIt is sunny.', "
            "{})], content ''") in served.detail
    assert ("FAIL: 5 of 5 malformed tool calls mishandled, 0 of 1 well-formed ones broken, on the server's path "
            "(streamed and not)") in served.detail
    assert "ok   a literal <tool_call> inside a parameter value (well-formed)" in served.detail
