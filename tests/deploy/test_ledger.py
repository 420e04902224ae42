"""The start ledger against the real vLLM sources of every release v0.28.0 ... v0.34.0 and the real CPU server's log.

Lines are built from the format strings as each release's source spells them (found with Python's ast: a
%-format given to a logger call, or an f-string), every placeholder filled with a distinct number, then parsed:
each number must come back as the field the pattern says, and a pattern must be found in exactly the releases
it claims. tests/data/deploy/cpu-server-start-0.32.0.log is the whole `docker logs` of the real vLLM 0.32.0 CPU
test server (scripts/build-test-server-image, the tiny Qwen3, started by `vpatch serve` as
tests/helpers/serverimage.py's tiny_serve configures it, captured once after it was healthy).
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest
from conftest import REAL_CACHE, RELEASE_VERSIONS

from vpatch.deploy import ledger
from vpatch.git import run as git_run

ALL_RELEASES = [*RELEASE_VERSIONS, "0.34.0"]
DATA = Path(__file__).resolve().parents[1] / "data" / "deploy"
PREFIX = "(Worker_TP1 pid=4242) INFO 09-24 20:01:02 [x.py:1] "

pytestmark = pytest.mark.releases


@pytest.fixture(scope="module")
def history() -> Path:
    """The real release history with v0.34.0 too (`vpatch releases` adds it from PyPI)."""
    from vpatch.upstream import releases

    return releases.ensure_history(ALL_RELEASES, cache=REAL_CACHE)


# --- the format strings, as the source writes them ---------------------------------------------------------

Part = str | tuple[str, str]  # literal text, or a placeholder ("%", spec) / ("f", format_spec)


def _percent_parts(fmt: str) -> list[Part]:
    parts: list[Part] = []
    pos = 0
    for m in re.finditer(r"%(?:%|[-+ #0]*\d*(?:\.\d+)?[sdfirx])", fmt):
        parts.append(fmt[pos:m.start()])
        parts.append("%" if m[0] == "%%" else ("%", m[0]))
        pos = m.end()
    parts.append(fmt[pos:])
    return parts


def _fstring_parts(node: ast.JoinedStr) -> list[Part]:
    parts: list[Part] = []
    for value in node.values:
        if isinstance(value, ast.Constant):
            parts.append(str(value.value))
        elif isinstance(value, ast.FormattedValue):
            spec = ""
            if isinstance(value.format_spec, ast.JoinedStr):
                spec = "".join(str(v.value) for v in value.format_spec.values if isinstance(v, ast.Constant))
            parts.append(("f", spec))
    return parts


def formats(source: str, marker: str) -> list[list[Part]]:
    """Every message in `source` that contains `marker`: a string constant given to a call (a logger's
    %-format) or an f-string (vLLM builds some messages as f-strings and logs them whole)."""
    found: list[list[Part]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str) and marker in first.value:
                found.append(_percent_parts(first.value))
        elif isinstance(node, ast.JoinedStr):
            text = "".join(str(v.value) if isinstance(v, ast.Constant) else "\0" for v in node.values)
            if marker in text:
                found.append(_fstring_parts(node))
    return found


@functools.cache  # the sources of a release do not change: each is read once per session
def release_formats(history: Path, tag: str, marker: str) -> list[list[Part]]:
    listed = git_run(history, ["grep", "-l", "-F", marker, tag, "--", "vllm"], check=False).out.split()
    out = []
    for entry in listed:
        path = entry.split(":", 1)[1]
        source = git_run(history, ["show", f"{tag}:{path}"]).out
        out += formats(source, marker)
    return out


def _value(slot: str | None, index: int, spec: str) -> str:
    """A distinct value for placeholder `index`, written as the format's spec writes it."""
    if slot == "version":
        return "0.99.1"
    if slot is None and index == 0 and spec in ("%s",):
        return "GPU"  # the device word of "%s KV cache size" (v0.29.0 on)
    number = 1000 + 137 * index if slot and slot.endswith("tokens") else 10 + 1.25 * (index + 1) + 0.01
    if spec.startswith("%") and spec != "%s":
        return spec % number
    if spec.startswith(".") or spec.startswith(","):
        return format(number, spec)
    return f"{number:,}" if isinstance(number, int) else f"{round(number, 2)}"


def build(parts: list[Part], slots: tuple[str | None, ...]) -> tuple[str, dict[str, str]]:
    """The line the format writes with distinct values, and {field: the text written for it}."""
    text, expected, index = [], {}, 0
    for part in parts:
        if isinstance(part, str):
            text.append(part)
            continue
        slot = slots[index] if index < len(slots) else None
        written = _value(slot, index, part[1])
        text.append(written)
        if slot is not None:
            expected[slot] = written
        index += 1
    return "".join(text), expected


def _slots_for(pattern: ledger.LinePattern, parts: list[Part]) -> tuple[str | None, ...]:
    count = sum(1 for p in parts if not isinstance(p, str))
    return next((s for s in pattern.slots if len(s) == count), pattern.slots[0])


# --- a test per release --------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", ALL_RELEASES)
def test_every_ledger_line_of_the_release_parses_back(history: Path, version: str) -> None:
    tag = f"v{version}"
    checked = 0
    for pattern in ledger.PATTERNS:
        found = release_formats(history, tag, pattern.marker)
        # The pattern names exactly the releases whose sources write its line.
        assert bool(found) == (tag in pattern.releases), (pattern.name, tag, len(found))
        for parts in found:
            line, expected = build(parts, _slots_for(pattern, parts))
            parsed = ledger.parse_line(PREFIX + line)
            assert parsed is not None, f"{tag} {pattern.name}: {line!r} not read"
            worker, fields = parsed
            assert worker == "Worker_TP1"
            for field, written in expected.items():
                assert fields.get(field) is not None, f"{tag} {pattern.name}: {field} missing from {line!r}"
                if field == "version":
                    assert fields[field] == written
                else:
                    assert float(fields[field].replace(",", "")) == float(written.replace(",", "")), (field, line)
            checked += 1
    assert checked >= 12  # every pattern has at least one format in every release it claims


@pytest.mark.parametrize("version", ALL_RELEASES)
def test_the_release_writes_a_cpu_and_a_gpu_ledger(history: Path, version: str) -> None:
    """The CPU path (cpu_worker's KV line, the loader, the pool, engine init) and the GPU path (the worker's
    KV memory and usage lines, the model runner's load and graph lines) as whole logs of one release."""
    tag = f"v{version}"

    def log_of(names: list[str], who: str) -> str:
        lines = []
        for pattern in ledger.PATTERNS:
            if pattern.name not in names:
                continue
            for parts in release_formats(history, tag, pattern.marker):
                lines.append(f"({who} pid=7) INFO 09-24 20:01:02 [x.py:1] " + build(parts, _slots_for(pattern, parts))[0])
        return "\n".join(lines)

    cpu = ledger.parse_start_log(log_of(["weights load", "cpu kv memory (auto)", "kv pool", "engine init"], "Worker"))
    assert cpu.per_worker("kv_memory_gib") and cpu.per_worker("non_kv_gib") and cpu.per_worker("kv_tokens")
    assert cpu.per_worker("weights_load_s") and cpu.per_worker("engine_init_s")
    assert not cpu.per_worker("cuda_graph_gib")  # the CPU path writes no graph line: absent, not zero
    gpu = ledger.parse_start_log(log_of(["model load", "memory usage", "kv memory", "graph capture", "cuda graph pool"],
                                        "Worker_TP0"))
    assert set(gpu.workers) == {"Worker_TP0"}
    non_torch = gpu.per_worker("non_torch_gib")["Worker_TP0"]
    assert non_torch == round(gpu.per_worker("consumed_gib")["Worker_TP0"] - gpu.per_worker("weights_gib")["Worker_TP0"], 2)
    # v0.34.0 dropped the model runner's "Estimated CUDA graph memory: … GiB total" line.
    estimate = ledger.written_by(version, "cuda_graph_estimate_gib")
    assert estimate is True  # still in "CUDA graph pool memory: … (estimated)", written by every release


def test_v0_34_no_longer_writes_the_model_runners_cuda_graph_estimate(history: Path) -> None:
    assert release_formats(history, "v0.33.0", "Estimated CUDA graph memory: %")
    assert not release_formats(history, "v0.34.0", "Estimated CUDA graph memory: %")


# --- the real CPU server's log ---------------------------------------------------------------------------------

def test_the_real_cpu_server_log() -> None:
    log = (DATA / "cpu-server-start-0.32.0.log").read_text()
    found = ledger.parse_start_log(log)
    assert found.version == "0.32.0"
    assert found.per_worker("weights_load_s") == {"Worker": 0.01}
    assert found.per_worker("kv_memory_gib") == {"Worker": 0.0}
    assert found.per_worker("device_total_gib") == {"Worker": 23.54}
    assert found.per_worker("kv_tokens") == {"EngineCore": 2048.0}
    assert found.per_worker("max_concurrency") == {"EngineCore": 2.0}
    assert found.per_worker("engine_init_s") == {"EngineCore": 0.01}
    # What the CPU server does not write stays absent.
    for field in ("weights_gib", "cuda_graph_gib", "graph_capture_s", "consumed_gib", "non_torch_gib", "torch_peak_gib"):
        assert not found.per_worker(field), field


def test_a_later_start_in_the_same_log_wins_and_differences_are_named() -> None:
    first = (f"{PREFIX}Loading weights took 107.00 seconds\n{PREFIX}Model loading took 14.2 GiB memory and 108.5 seconds\n"
             f"{PREFIX}Free memory on device (31.36/31.36 GiB) on startup. Desired GPU memory utilization is (0.9, "
             "28.22 GiB). Actual usage is 15.3 GiB for consumed memory (weights + non-torch), 2.1 GiB for peak "
             "activation, and 0.5 GiB for CUDAGraph memory. Replace …")
    base = ledger.parse_start_log(first.replace("107.00", "50.00") + "\n" + first)
    assert base.per_worker("weights_load_s") == {"Worker_TP1": 107.0}
    assert base.per_worker("non_torch_gib") == {"Worker_TP1": 1.1}
    cand = ledger.parse_start_log(first.replace("107.00", "151.00").replace("15.3 GiB for consumed", "16.4 GiB for consumed"))
    named = ledger.differences(base, cand)
    assert "weights load +44.00 s" in named
    assert "non-torch memory (consumed - weights) +1.10 GiB" in named
    assert not any(n.startswith("weights memory") for n in named)  # equal: no difference named


@pytest.mark.parametrize("version", ALL_RELEASES)
def test_the_release_announces_its_server_line(history: Path, version: str) -> None:
    """The time stamp of "Starting vLLM server on %s" is when the server listens (serving_s reads it)."""
    (parts, *_rest) = release_formats(history, f"v{version}", ledger.SERVING)
    assert parts[0] == "Starting vLLM server on " and len([p for p in parts if not isinstance(p, str)]) == 1


def test_serving_after_reads_the_servers_own_time_stamp() -> None:
    from datetime import UTC, datetime

    log = (DATA / "cpu-server-start-0.32.0.log").read_text()
    # The container started at 16:56:05.7 (UTC); vLLM stamped "Starting vLLM server on …" 12-04 16:56:41.
    found = ledger.parse_start_log(log, started_at=datetime(2026, 12, 4, 16, 56, 5, 700000, tzinfo=UTC))
    assert found.per_worker("serving_s") == {ledger.SERVER: 36.0}
    assert found.per_worker("first_line_s") == {ledger.SERVER: 1.0}  # "12-04 16:56:06", the banner
    assert ledger.parse_start_log(log).per_worker("serving_s") == {}  # no start time given: absent


def test_absent_lines_are_said_only_where_the_release_does_not_write_them() -> None:
    cpu = ledger.parse_start_log((DATA / "cpu-server-start-0.32.0.log").read_text())
    assert ledger.absent_note(cpu, [f.name for f in ledger.FIELDS]) == []  # v0.32.0 writes them (on a GPU)
    later = ledger.StartLedger(cpu.values, "0.34.0")
    assert ledger.absent_note(later, ["cuda_graph_estimate_gib", "non_torch_gib"]) == []  # still in the pool line
    assert ledger.written_by("0.99.0", "weights_gib") is None  # a release the table does not know: no claim
