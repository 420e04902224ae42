"""`deploy:` in images/<name>.yaml: the check suite with its thresholds, and the switch hooks."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vpatch.config import _Doc
from vpatch.errors import ConfigError

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
class CeilingCheck:
    """One request sized to the pool's real ceiling (one-block-short): it must end with stop or length."""

    max_tokens: int = 16  # the prompt fills the rest: min(max_model_len, KV pool - 1 block) - max_tokens


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
    log_patterns: tuple[str, ...] = DEFAULT_LOG_PATTERNS
    hooks: Hooks = field(default_factory=Hooks)

    @classmethod
    def parse(cls, data: Any, *, root: Path, source: str) -> Suite:
        doc = _Doc(source)
        top = doc.mapping(data, "deploy", optional={"start_watch_s", "health_timeout_s", "request_timeout_s", "stall_s", "checks", "hooks"})
        checks = doc.mapping(top.get("checks") or {}, "deploy.checks", optional={
            "kv_pool", "block_cost", "needles", "tool_call", "questions", "parallel", "ceiling", "log_scan"})
        hooks = doc.mapping(top.get("hooks") or {}, "deploy.hooks", optional={"before_switch", "after_switch"})
        log = doc.mapping(checks.get("log_scan") or {}, "deploy.checks.log_scan", optional={"patterns"})
        patterns = log.get("patterns", list(DEFAULT_LOG_PATTERNS))
        if not isinstance(patterns, list) or not all(isinstance(p, str) and p.strip() for p in patterns):
            doc.fail("deploy.checks.log_scan.patterns", f"must be a list of non-empty strings, not {patterns!r}")
        return cls(
            start_watch_s=_number(doc, top, "deploy.start_watch_s", 20.0),
            health_timeout_s=_number(doc, top, "deploy.health_timeout_s", 900.0),
            request_timeout_s=_number(doc, top, "deploy.request_timeout_s", 600.0),
            stall_s=_number(doc, top, "deploy.stall_s", 30.0),
            kv_pool=_kv_pool(doc, checks.get("kv_pool")),
            block_cost=_block_cost(doc, checks.get("block_cost")),
            needles=_needles(doc, checks.get("needles")),
            tool_call=_tool_call(doc, checks.get("tool_call")),
            questions=_questions(doc, checks.get("questions"), root),
            parallel=_parallel(doc, checks.get("parallel")),
            ceiling=_ceiling(doc, checks.get("ceiling")),
            log_patterns=tuple(patterns),
            hooks=Hooks(_commands(doc, hooks, "before_switch"), _commands(doc, hooks, "after_switch")),
        )


def _number(doc: _Doc, data: dict[str, Any], key: str, default: float | None = None) -> float:
    value = data.get(key.rsplit(".", 1)[-1], default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        doc.fail(key, f"must be a positive number, not {value!r}")
    return float(value)


def _count(doc: _Doc, data: dict[str, Any], key: str, default: int | None = None, *, zero: bool = False) -> int:
    value = data.get(key.rsplit(".", 1)[-1], default)
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if zero else 1):
        doc.fail(key, f"must be a {'non-negative' if zero else 'positive'} whole number, not {value!r}")
    return value


def _section(doc: _Doc, value: Any, key: str, required: set[str], optional: set[str]) -> dict[str, Any] | None:
    if value is None or value is False:
        return None
    return doc.mapping({} if value is True else value, key, required=required, optional=optional)


def _kv_pool(doc: _Doc, value: Any) -> KvPoolCheck | None:
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


def _block_cost(doc: _Doc, value: Any) -> BlockCostCheck | None:
    key = "deploy.checks.block_cost"
    data = _section(doc, value, key, {"prompt_tokens"}, {"max_tokens", "max_ratio"})
    if data is None:
        return None
    return BlockCostCheck(
        prompt_tokens=_count(doc, data, f"{key}.prompt_tokens"),
        max_tokens=_count(doc, data, f"{key}.max_tokens", 16),
        max_ratio=_number(doc, data, f"{key}.max_ratio", 1.25),
    )


def _needles(doc: _Doc, value: Any) -> NeedleCheck | None:
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


def _tool_call(doc: _Doc, value: Any) -> ToolCallCheck | None:
    data = _section(doc, value, "deploy.checks.tool_call", set(), {"extra"})
    if data is None:
        return None
    extra = data.get("extra") or {}
    if not isinstance(extra, dict):
        doc.fail("deploy.checks.tool_call.extra", f"must be a mapping of request fields, not {extra!r}")
    return ToolCallCheck(extra=dict(extra))


def _questions(doc: _Doc, value: Any, root: Path) -> QuestionCheck | None:
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
    """A question file: a YAML list of {ask: text, expect: text or list of texts}."""
    import yaml

    doc = _Doc(source)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{source}: cannot read the question file: {exc}",
                          hint="deploy.checks.questions.file names a YAML list of {ask, expect}") from exc
    if not isinstance(data, list) or not data:
        doc.fail("", "must be a non-empty list of {ask, expect}")
    out = []
    for i, item in enumerate(data):
        entry = doc.mapping(item, f"[{i}]", required={"ask", "expect"})
        expect = entry["expect"]
        expects = [expect] if isinstance(expect, (str, int, float)) and not isinstance(expect, bool) else expect
        if not isinstance(expects, list) or not expects or not all(isinstance(e, (str, int, float)) for e in expects):
            doc.fail(f"[{i}].expect", f"must be an answer or a list of accepted answers, not {expect!r}")
        out.append(Question(ask=doc.string(entry, f"[{i}].ask"), expect=tuple(str(e) for e in expects)))
    return tuple(out)


def _parallel(doc: _Doc, value: Any) -> ParallelCheck | None:
    key = "deploy.checks.parallel"
    data = _section(doc, value, key, {"requests", "prompt_tokens"}, {"max_tokens", "max_preemptions"})
    if data is None:
        return None
    return ParallelCheck(
        requests=_count(doc, data, f"{key}.requests"),
        prompt_tokens=_count(doc, data, f"{key}.prompt_tokens"),
        max_tokens=_count(doc, data, f"{key}.max_tokens", 64),
        max_preemptions=_count(doc, data, f"{key}.max_preemptions", 0, zero=True),
    )


def _ceiling(doc: _Doc, value: Any) -> CeilingCheck | None:
    data = _section(doc, value, "deploy.checks.ceiling", set(), {"max_tokens"})
    if data is None:
        return None
    return CeilingCheck(max_tokens=_count(doc, data, "deploy.checks.ceiling.max_tokens", 16))


def _commands(doc: _Doc, hooks: dict[str, Any], name: str) -> tuple[tuple[str, ...], ...]:
    value = hooks.get(name) or []
    key = f"deploy.hooks.{name}"
    if not isinstance(value, list):
        doc.fail(key, "must be a list of commands, each a list of arguments (no shell)")
    out = []
    for i, cmd in enumerate(value):
        if not isinstance(cmd, list) or not cmd or not all(isinstance(a, str) for a in cmd):
            doc.fail(f"{key}[{i}]", f"must be a command as a list of strings, not {cmd!r}")
        out.append(tuple(cmd))
    return tuple(out)
