"""What a vLLM server says about itself, parsed: the start log, Prometheus /metrics, streamed responses."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from vpatch.serve import metric_samples

# "GPU KV cache size: 1,050,422 tokens" / "CPU KV cache size: 2,048 tokens": one number per engine
# (data-parallel engines each log their own line; the first is the pool every request sees).
_KV_SIZE = re.compile(r"\b(?:[A-Z]+ )?KV cache size: ([\d,]+) tokens")
_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.,]+)x")


def _number(text: str) -> float:
    return float(text.replace(",", ""))


@dataclass(frozen=True)
class KvPool:
    """The start log's own arithmetic: the pool in tokens and full-length requests that fit at once."""

    tokens: int
    request_tokens: int | None = None  # L in "Maximum concurrency for L tokens per request"
    concurrency: float | None = None


def kv_pool_from_log(log: str) -> KvPool | None:
    """The KV pool the server announced at its latest start (GPU or CPU wording); None when the log has no such line."""
    # The last announcement: a container's log holds every start it had, and the latest one counts.
    sizes = list(_KV_SIZE.finditer(log))
    if not sizes:
        return None
    size = sizes[-1]
    conc = _CONCURRENCY.search(log, size.start())
    if conc is None:
        return KvPool(tokens=int(_number(size[1])))
    return KvPool(tokens=int(_number(size[1])), request_tokens=int(_number(conc[1])), concurrency=_number(conc[2]))


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class Metrics:
    """One scrape of /metrics in the Prometheus text format."""

    samples: tuple[Sample, ...]

    @classmethod
    def parse(cls, text: str) -> Metrics:
        return cls(tuple(Sample(name, labels, value) for name, labels, value in metric_samples(text)))

    def find(self, name: str) -> list[Sample]:
        return [s for s in self.samples if s.name == name]

    def total(self, name: str) -> float | None:
        """The sum over all label sets (engines) of `name`; None when the server does not export it."""
        found = self.find(name)
        return sum(s.value for s in found) if found else None

    @property
    def kv_usage(self) -> float | None:
        """Fraction of the KV pool held by requests (0..1); the largest engine's when there are several."""
        found = self.find("vllm:kv_cache_usage_perc") or self.find("vllm:gpu_cache_usage_perc")
        return max(s.value for s in found) if found else None

    @property
    def preemptions(self) -> float | None:
        return self.total("vllm:num_preemptions_total")

    @property
    def cache_geometry(self) -> CacheGeometry | None:
        for sample in self.find("vllm:cache_config_info"):
            blocks = sample.labels.get("num_gpu_blocks") or sample.labels.get("num_cpu_blocks")
            size = sample.labels.get("block_size")
            if blocks and size and blocks.isdigit() and size.isdigit():
                return CacheGeometry(blocks=int(blocks), block_size=int(size))
        return None


@dataclass(frozen=True)
class CacheGeometry:
    """The pool as vLLM sized it: `blocks` blocks of `block_size` tokens each."""

    blocks: int
    block_size: int

    def predicted_blocks(self, tokens: int) -> int:
        """Blocks a request of `tokens` tokens should hold if it costs what the geometry says (ceil)."""
        return -(-tokens // self.block_size)


@dataclass(frozen=True)
class BlockCost:
    """Blocks one request held at its peak, against what the geometry predicts for its length."""

    tokens: int
    held: int
    predicted: int

    @property
    def tokens_per_block(self) -> float:
        return self.tokens / self.held if self.held else float("inf")

    @property
    def ratio(self) -> float:
        """held / predicted: 1.0 costs what the start log's arithmetic assumes; the Mamba leak was 2.5."""
        return self.held / self.predicted if self.predicted else float("inf")


def block_cost(tokens: int, usage_samples: Iterable[float], geometry: CacheGeometry, idle_usage: float = 0.0) -> BlockCost:
    """Blocks held by one request from sampled pool usage while it ran alone (minus what was held before)."""
    peak = max(usage_samples, default=idle_usage)
    held = round(max(0.0, peak - idle_usage) * geometry.blocks)
    return BlockCost(tokens=tokens, held=held, predicted=geometry.predicted_blocks(tokens))


def sse_events(lines: Iterable[str]) -> Iterable[dict[str, object]]:
    """The JSON objects of an OpenAI-style server-sent event stream, up to `data: [DONE]`."""
    for raw in lines:
        line = raw.strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        event = json.loads(data)
        if isinstance(event, dict):
            yield event


class NotStrictJson(ValueError):
    """A text json.loads would take but JSON (RFC 8259) does not allow: NaN, Infinity, -Infinity."""


def _reject_constant(name: str) -> object:
    raise NotStrictJson(f"{name} is not valid JSON")


def strict_json(text: str) -> object:
    """Parse `text` as strict JSON: Python's json accepts NaN and Infinity, which other clients reject."""
    return json.loads(text, parse_constant=_reject_constant)


@dataclass(frozen=True)
class ToolCall:
    index: int
    name: str
    arguments: str  # as assembled from the stream's fragments


@dataclass
class StreamedChat:
    """A streamed chat completion put back together: text, tool calls, finish reason, token counts."""

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


def assemble_chat(events: Iterable[Mapping[str, object]]) -> StreamedChat:
    """Concatenate content deltas and tool-call fragments (by index) the way an OpenAI client does."""
    out = StreamedChat()
    names: dict[int, str] = {}
    args: dict[int, list[str]] = {}
    text: list[str] = []
    for event in events:
        usage = event.get("usage")
        if isinstance(usage, dict):
            out.prompt_tokens = usage.get("prompt_tokens", out.prompt_tokens)
            out.completion_tokens = usage.get("completion_tokens", out.completion_tokens)
        choices = event.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            delta = choice.get("delta") or {}
            if choice.get("finish_reason"):
                out.finish_reason = choice["finish_reason"]
            if delta.get("content"):
                text.append(delta["content"])
            for call in delta.get("tool_calls") or ():
                index = int(call.get("index", 0))
                function = call.get("function") or {}
                if function.get("name"):
                    names[index] = names.get(index, "") + function["name"]
                args.setdefault(index, []).append(function.get("arguments") or "")
    out.text = "".join(text)
    out.tool_calls = [ToolCall(i, names.get(i, ""), "".join(args.get(i, []))) for i in sorted(set(names) | set(args))]
    return out


@dataclass(frozen=True)
class LogFinding:
    pattern: str
    count: int
    lines: tuple[str, ...]  # the first few matching lines


def log_findings(log: str, patterns: Iterable[str], keep: int = 3) -> list[LogFinding]:
    """Each pattern found in `log` (case-insensitive substring) with its count and first `keep` lines."""
    hits: dict[str, list[str]] = {p: [] for p in patterns}
    lowered = [(p, p.lower()) for p in hits]
    for line in log.splitlines():
        low = line.lower()
        for pattern, needle in lowered:
            if needle in low:
                hits[pattern].append(line.strip())
    return [LogFinding(p, len(lines), tuple(lines[:keep])) for p, lines in hits.items() if lines]
