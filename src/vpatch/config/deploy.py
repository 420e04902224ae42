"""`deploy:` in images/<name>.yaml: the check suite with its thresholds, and the switch hooks.

A config-layer module (it imports nothing but document.py and errors.py), parsed on first use by
ImageDefinition; the sizes of the requests its checks send are checked against serve: by consistency.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vpatch.config.document import Document

DEFAULT_LOG_PATTERNS = ("memory allocation failed", "Traceback", "CUDA error", "out of memory")


@dataclass(frozen=True)
class KvPoolCheck:
    min_tokens: int  # the floor for the start log's "KV cache size: N tokens"
    min_concurrency: float | None = None  # floor for "Maximum concurrency for L tokens per request: X"
    max_drop: float | None = None  # largest allowed shrink against the baseline, as a fraction (0.05 = 5 %)


@dataclass(frozen=True)
class BlockCostCheck:
    prompt_tokens: int  # one request this long runs alone while kv_cache_usage_perc is sampled
    max_tokens: int = 16
    max_ratio: float = 1.25  # blocks held / blocks the geometry predicts; the Mamba leak measured 2.5


@dataclass(frozen=True)
class NeedleCheck:
    lengths: tuple[int, ...]  # prompt lengths in tokens, one needle each
    min_found: int | None = None  # default: every needle
    max_tokens: int = 32


@dataclass(frozen=True)
class ToolCallCheck:
    # Extra request fields, e.g. vLLM's structured_outputs to force a call from a model that would not make one.
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Question:
    ask: str
    expect: tuple[str, ...]  # any of these, case-insensitive, in the answer counts as right


@dataclass(frozen=True)
class QuestionCheck:
    file: Path
    questions: tuple[Question, ...]
    min_right: int
    max_tokens: int = 512


@dataclass(frozen=True)
class ParallelCheck:
    requests: int
    prompt_tokens: int
    max_tokens: int = 64
    max_preemptions: int = 0


@dataclass(frozen=True)
class RequestSize:
    """One request a check sends, as big as the yaml makes it: it must fit the server's max_model_len."""

    key: str  # the check's yaml key, e.g. deploy.checks.parallel
    prompt_tokens: int  # the prompt's nominal length (the chat template adds a few)
    max_tokens: int

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.max_tokens


@dataclass(frozen=True)
class CeilingCheck:
    """One request sized to the pool's real ceiling (one-block-short): it must end with stop or length."""

    max_tokens: int = 16  # the prompt fills the rest: min(max_model_len, KV pool - 1 block) - max_tokens


@dataclass(frozen=True)
class MemoryCheck:
    """Free memory of every device (each GPU, or the container against its limit), sampled through every
    check that sends requests: the first reading below the floor fails the check running then."""

    min_free_mib: float


@dataclass(frozen=True)
class TimingCheck:
    """The timing figures measured `repeats` times each, so that a difference can be told from noise: a short
    request (time to first token, decode rate), a long one (its prefill), and `parallel` requests at once (the
    makespan). A measurement: it fails only when a request fails."""

    repeats: int = 5  # 5 a side: two equal builds separate completely by chance 1 time in 126
    prompt_tokens: int = 128
    max_tokens: int = 32
    long_prompt_tokens: int | None = None  # the long prefill; None: not measured
    parallel: int = 0  # requests at once of prompt_tokens each for the makespan; 0: not measured
    min_change: float = 0.10  # a difference smaller than this fraction of the baseline's median is noise anyway


@dataclass(frozen=True)
class Hooks:
    before_switch: tuple[tuple[str, ...], ...] = ()  # argv lists, run before the production container is parked
    after_switch: tuple[tuple[str, ...], ...] = ()  # run after the decision (deployed or rolled back)


@dataclass(frozen=True)
class Suite:
    """Which checks run (an absent one is skipped and says so), with what thresholds, in a fixed order."""

    start_watch_s: float = 20.0  # how long a started container must stay up without a restart
    health_timeout_s: float = 900.0
    request_timeout_s: float = 600.0
    stall_s: float = 30.0  # requests outstanding and no token for this long: the engine is stalled, the check fails
    kv_pool: KvPoolCheck | None = None
    block_cost: BlockCostCheck | None = None
    needles: NeedleCheck | None = None
    tool_call: ToolCallCheck | None = None
    questions: QuestionCheck | None = None
    parallel: ParallelCheck | None = None
    ceiling: CeilingCheck | None = None
    memory: MemoryCheck | None = None
    timing: TimingCheck | None = None
    log_patterns: tuple[str, ...] = DEFAULT_LOG_PATTERNS
    hooks: Hooks = field(default_factory=Hooks)

    def request_sizes(self) -> tuple[RequestSize, ...]:
        """The largest request of each check that sends one (a new such check adds its own here)."""
        out = []
        if self.block_cost is not None:
            out.append(RequestSize("deploy.checks.block_cost", self.block_cost.prompt_tokens, self.block_cost.max_tokens))
        if self.needles is not None:
            out.append(RequestSize("deploy.checks.needles", max(self.needles.lengths), self.needles.max_tokens))
        if self.questions is not None:
            out.append(RequestSize("deploy.checks.questions", 0, self.questions.max_tokens))
        if self.parallel is not None:
            out.append(RequestSize("deploy.checks.parallel", self.parallel.prompt_tokens, self.parallel.max_tokens))
        if self.ceiling is not None:  # its prompt is sized to the pool at run time; its output must leave room for one
            out.append(RequestSize("deploy.checks.ceiling", 1, self.ceiling.max_tokens))
        if self.timing is not None:
            longest = max(self.timing.prompt_tokens, self.timing.long_prompt_tokens or 0)
            out.append(RequestSize("deploy.checks.timing", longest, self.timing.max_tokens))
        return tuple(out)

    @classmethod
    def parse(cls, data: Any, *, root: Path, source: str) -> Suite:
        doc = Document(source)
        # Present but empty (deploy: [], checks: false, hooks: 0) is an error, never the defaults.
        top = doc.filled(data, "deploy", optional={"start_watch_s", "health_timeout_s", "request_timeout_s", "stall_s", "checks", "hooks"})
        checks = doc.section(top, "deploy.checks", optional={
            "kv_pool", "block_cost", "needles", "tool_call", "questions", "parallel", "ceiling", "memory", "timing", "log_scan"}) or {}
        for name, value in checks.items():
            if not isinstance(value, dict):
                doc.fail(f"deploy.checks.{name}", f"must be a mapping of its settings ({{}} for its defaults), not "
                         f"{doc.shown(value)}", hint=f"leave deploy.checks.{name} out to skip the check")
        hooks = doc.section(top, "deploy.hooks", optional={"before_switch", "after_switch"}) or {}
        log = doc.section(checks, "deploy.checks.log_scan", optional={"patterns"}) or {}
        patterns = log.get("patterns", list(DEFAULT_LOG_PATTERNS))
        if not isinstance(patterns, list) or not all(isinstance(p, str) and p.strip() for p in patterns):
            doc.fail("deploy.checks.log_scan.patterns", f"must be a list of non-empty strings, not {patterns!r}")
        if not patterns:
            doc.fail("deploy.checks.log_scan.patterns", "is an empty list: the log scan would find nothing in any log",
                     hint=f"leave the key out for the defaults ({', '.join(DEFAULT_LOG_PATTERNS)}), or name patterns")
        return cls(
            start_watch_s=_seconds(doc, top, "deploy.start_watch_s", 20.0, 1.0, 3600.0,
                               "a crash loop shows in seconds; 30000 reads like milliseconds"),
            health_timeout_s=_seconds(doc, top, "deploy.health_timeout_s", 900.0, 1.0, _WEEK, "no server loads for a week"),
            request_timeout_s=_seconds(doc, top, "deploy.request_timeout_s", 600.0, 1.0, _WEEK,
                                       "no check request is answered in under a second of a loaded server"),
            stall_s=_seconds(doc, top, "deploy.stall_s", 30.0, 1.0, _WEEK,
                             "under a second every request still waiting for its next token counts as a stall"),
            kv_pool=_kv_pool(doc, checks.get("kv_pool")),
            block_cost=_block_cost(doc, checks.get("block_cost")),
            needles=_needles(doc, checks.get("needles")),
            tool_call=_tool_call(doc, checks.get("tool_call")),
            questions=_questions(doc, checks.get("questions"), root),
            parallel=_parallel(doc, checks.get("parallel")),
            ceiling=_ceiling(doc, checks.get("ceiling")),
            memory=_memory(doc, checks.get("memory")),
            timing=_timing(doc, checks.get("timing")),
            log_patterns=tuple(patterns),
            hooks=Hooks(_commands(doc, hooks, "before_switch"), _commands(doc, hooks, "after_switch")),
        )


def _number(doc: Document, data: dict[str, Any], key: str, default: float | None = None) -> float:
    return doc.number(data, key, default)  # finite: .nan would pass every comparison's check


_WEEK = 7 * 24 * 3600.0
_MAX_PARALLEL = 1024  # requests sent at once, by the baseline to production too
# Request fields the tool-call check sets itself and reads back: `extra` overriding one tests something else.
_TOOL_CALL_OWN = ("stream", "stream_options", "tools", "tool_choice", "messages", "model", "max_tokens", "n")


def _seconds(doc: Document, data: dict[str, Any], key: str, default: float, low: float, high: float, why: str) -> float:
    """A wait in seconds within what a check can use: below `low` it can never pass, above `high` it is a typo."""
    value = _number(doc, data, key, default)
    if not low <= value <= high:
        doc.fail(key, f"is {value:g} s, {'under' if value < low else 'over'} {low if value < low else high:g} s: {why}",
                 hint=f"give {key} in seconds, between {low:g} and {high:g}")
    return value


def _count(doc: Document, data: dict[str, Any], key: str, default: int | None = None, *, zero: bool = False) -> int:
    return doc.count(data, key, default, zero=zero)


def _section(doc: Document, value: Any, key: str, required: set[str], optional: set[str]) -> dict[str, Any] | None:
    if value is None:
        return None  # absent (Suite.parse refused a present but empty one)
    return doc.mapping(value, key, required=required, optional=optional)


def _kv_pool(doc: Document, value: Any) -> KvPoolCheck | None:
    key = "deploy.checks.kv_pool"
    data = _section(doc, value, key, {"min_tokens"}, {"min_concurrency", "max_drop"})
    if data is None:
        return None
    max_drop = _number(doc, data, f"{key}.max_drop") if "max_drop" in data else None
    if max_drop is not None and max_drop >= 1:
        doc.fail(f"{key}.max_drop", f"is a fraction below 1 (0.05 = 5 %), not {max_drop!r}")
    return KvPoolCheck(
        min_tokens=_count(doc, data, f"{key}.min_tokens"),
        min_concurrency=_number(doc, data, f"{key}.min_concurrency") if "min_concurrency" in data else None,
        max_drop=max_drop,
    )


def _block_cost(doc: Document, value: Any) -> BlockCostCheck | None:
    key = "deploy.checks.block_cost"
    data = _section(doc, value, key, {"prompt_tokens"}, {"max_tokens", "max_ratio"})
    if data is None:
        return None
    max_ratio = _number(doc, data, f"{key}.max_ratio", 1.25)
    if max_ratio < 1:
        # held / predicted: a request holds at least the blocks its tokens fill, so the ratio is never below 1.
        doc.fail(f"{key}.max_ratio", f"is {max_ratio:g}: the ratio is the blocks the request holds over the "
                 "ceil(tokens / block_size) its tokens need, at least 1, so the check could never pass",
                 hint=f"give {key}.max_ratio at 1 or above (1.25: a quarter more than predicted)")
    return BlockCostCheck(
        prompt_tokens=_count(doc, data, f"{key}.prompt_tokens"),
        max_tokens=_count(doc, data, f"{key}.max_tokens", 16),
        max_ratio=max_ratio,
    )


def _needles(doc: Document, value: Any) -> NeedleCheck | None:
    key = "deploy.checks.needles"
    data = _section(doc, value, key, {"lengths"}, {"min_found", "max_tokens"})
    if data is None:
        return None
    lengths = data["lengths"]
    if not isinstance(lengths, list) or not lengths or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in lengths):
        doc.fail(f"{key}.lengths", f"must be a list of token counts, not {lengths!r}")
    min_found = _count(doc, data, f"{key}.min_found", zero=True) if "min_found" in data else None
    if min_found is not None and min_found > len(lengths):
        doc.fail(f"{key}.min_found", f"is {min_found}, more than the {len(lengths)} needles")
    return NeedleCheck(lengths=tuple(lengths), min_found=min_found, max_tokens=_count(doc, data, f"{key}.max_tokens", 32))


def _tool_call(doc: Document, value: Any) -> ToolCallCheck | None:
    data = _section(doc, value, "deploy.checks.tool_call", set(), {"extra"})
    if data is None:
        return None
    extra = data.get("extra") or {}
    if not isinstance(extra, dict):
        doc.fail("deploy.checks.tool_call.extra", f"must be a mapping of request fields, not {extra!r}")
    for name in extra:
        if name in _TOOL_CALL_OWN:
            doc.fail(f"deploy.checks.tool_call.extra.{name}", "is a field the check sets itself and reads back "
                     f"({', '.join(_TOOL_CALL_OWN)}): overridden, the check would test something else or never pass",
                     hint="extra adds fields (e.g. structured_outputs); remove this one")
    return ToolCallCheck(extra=dict(extra))


def _questions(doc: Document, value: Any, root: Path) -> QuestionCheck | None:
    key = "deploy.checks.questions"
    data = _section(doc, value, key, {"file", "min_right"}, {"max_tokens"})
    if data is None:
        return None
    rel = doc.string(data, f"{key}.file")
    if Path(rel).is_absolute() or ".." in Path(rel).parts:
        doc.fail(f"{key}.file", f"must be a file inside the project, not {rel!r}")
    questions = load_questions(root / rel, rel)
    min_right = _count(doc, data, f"{key}.min_right", zero=True)
    if min_right > len(questions):
        doc.fail(f"{key}.min_right", f"is {min_right}, more than the {len(questions)} questions in {rel}")
    return QuestionCheck(file=Path(rel), questions=questions, min_right=min_right,
                         max_tokens=_count(doc, data, f"{key}.max_tokens", 512))


def load_questions(path: Path, source: str) -> tuple[Question, ...]:
    """A question file: a YAML list of {ask: text, expect: text or list of texts}. Read like every vpatch
    file (a key given twice is an error); answers as written (`yes` stays "yes", `1.10` stays "1.10")."""
    doc, data = Document.read(path, source=source, what="the question file",
                              hint="deploy.checks.questions.file names a YAML list of {ask, expect}")
    if not isinstance(data, list) or not data:
        doc.fail("", "must be a non-empty list of {ask, expect}")
    out = []
    for i, item in enumerate(data):
        entry = doc.mapping(item, f"[{i}]", required={"ask", "expect"})
        expects = entry["expect"] if isinstance(entry["expect"], list) else [entry["expect"]]
        if not expects:
            doc.fail(f"[{i}].expect", "is an empty list: give the accepted answers")
        texts = [doc.text(expects, j, f"[{i}].expect") if isinstance(entry["expect"], list)
                 else doc.text(entry, "expect", f"[{i}].expect") for j in range(len(expects))]
        for text in texts:
            if not text.strip():
                # An empty expected answer is in every answer: the question would always count as right.
                doc.fail(f"[{i}].expect", f"holds an empty answer ({text!r}), which every answer contains")
        out.append(Question(ask=doc.string(entry, f"[{i}].ask"), expect=tuple(texts)))
    return tuple(out)


def _parallel(doc: Document, value: Any) -> ParallelCheck | None:
    key = "deploy.checks.parallel"
    data = _section(doc, value, key, {"requests", "prompt_tokens"}, {"max_tokens", "max_preemptions"})
    if data is None:
        return None
    requests = _count(doc, data, f"{key}.requests")
    if requests > _MAX_PARALLEL:
        doc.fail(f"{key}.requests", f"is {requests:,}: the check sends them all at once, to production too in the "
                 f"baseline ({requests:,} x (prompt_tokens + max_tokens) tokens); at most {_MAX_PARALLEL:,}",
                 hint="a few more than serve.max_num_seqs shows preemptions; more only loads production")
    return ParallelCheck(
        requests=requests,
        prompt_tokens=_count(doc, data, f"{key}.prompt_tokens"),
        max_tokens=_count(doc, data, f"{key}.max_tokens", 64),
        max_preemptions=_count(doc, data, f"{key}.max_preemptions", 0, zero=True),
    )


def _ceiling(doc: Document, value: Any) -> CeilingCheck | None:
    data = _section(doc, value, "deploy.checks.ceiling", set(), {"max_tokens"})
    if data is None:
        return None
    return CeilingCheck(max_tokens=_count(doc, data, "deploy.checks.ceiling.max_tokens", 16))


def _memory(doc: Document, value: Any) -> MemoryCheck | None:
    data = _section(doc, value, "deploy.checks.memory", {"min_free_mib"}, set())
    if data is None:
        return None
    return MemoryCheck(min_free_mib=_number(doc, data, "deploy.checks.memory.min_free_mib"))


def _timing(doc: Document, value: Any) -> TimingCheck | None:
    key = "deploy.checks.timing"
    data = _section(doc, value, key, set(), {"repeats", "prompt_tokens", "max_tokens", "long_prompt_tokens",
                                            "parallel", "min_change"})
    if data is None:
        return None
    repeats = _count(doc, data, f"{key}.repeats", 5)
    if repeats < 3:
        doc.fail(f"{key}.repeats", f"is {repeats}: with fewer than 3 a side no difference can be told from noise "
                 "(two equal builds separate completely 1 time in 3 with 2 each)",
                 hint=f"give {key}.repeats 3 or more (5: 1 time in 126), or leave the check out")
    min_change = _number(doc, data, f"{key}.min_change", 0.10)
    if not 0 <= min_change < 1:
        doc.fail(f"{key}.min_change", f"is a fraction of the baseline's median below 1 (0.10 = 10 %), not {min_change!r}")
    return TimingCheck(
        repeats=repeats,
        prompt_tokens=_count(doc, data, f"{key}.prompt_tokens", 128),
        max_tokens=_count(doc, data, f"{key}.max_tokens", 32),
        long_prompt_tokens=_count(doc, data, f"{key}.long_prompt_tokens") if "long_prompt_tokens" in data else None,
        parallel=_count(doc, data, f"{key}.parallel", 0, zero=True),
        min_change=min_change,
    )


def _commands(doc: Document, hooks: dict[str, Any], name: str) -> tuple[tuple[str, ...], ...]:
    value = hooks.get(name, [])
    key = f"deploy.hooks.{name}"
    if not isinstance(value, list):
        doc.fail(key, "must be a list of commands, each a list of arguments (no shell)")
    out = []
    for i, cmd in enumerate(value):
        if not isinstance(cmd, list) or not cmd or not all(isinstance(a, str) for a in cmd):
            doc.fail(f"{key}[{i}]", f"must be a command as a list of strings, not {cmd!r}")
        out.append(tuple(cmd))
    return tuple(out)
