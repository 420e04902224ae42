"""A server's answer to a live check's request, put back together, and the judging of it against the case.

Judging is pure (`judge`), so what "the server shows the fix" means lives in one place; the check's file is
livecheck.py's, sending the requests deploy/live.py's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vpatch.deploy.livecheck import Expect, ExpectedCall, Request
from vpatch.deploy.readings import NotStrictJson, strict_json


@dataclass(frozen=True)
class Observed:
    """An answer put back together the same way for streamed and whole responses."""

    content: str
    tool_calls: tuple[tuple[str, str], ...]  # (name, arguments text as the client assembled it)
    finish_reason: str | None
    token_ids: tuple[int, ...] | None = None  # the output's token ids, where the request asked for them

    def summary(self) -> str:
        calls = ", ".join(f"{n!r}({a})" for n, a in self.tool_calls) or "no tool call"
        return f"{calls}; content {_short(self.content)}; finish_reason {self.finish_reason}"


def judge(expect: Expect, seen: Observed) -> list[str]:
    """Every way `seen` differs from `expect`; empty when the answer shows what the check asks."""
    problems: list[str] = []
    if expect.tool_calls is not None:
        problems += _judge_calls(expect.tool_calls, seen.tool_calls)
    if expect.content is not None and seen.content.strip() != expect.content.strip():
        problems.append(f"content {_short(seen.content)}, expected {_short(expect.content)}")
    problems += [f"content {_short(seen.content)} lacks {text!r}" for text in expect.content_contains
                 if text not in seen.content]
    if expect.finish_reason is not None and seen.finish_reason != expect.finish_reason:
        problems.append(f"finish_reason {seen.finish_reason!r}, expected {expect.finish_reason!r}")
    return problems


def _judge_calls(expected: Sequence[ExpectedCall], seen: Sequence[tuple[str, str]]) -> list[str]:

    if len(seen) != len(expected):
        got = ", ".join(f"{n!r}" for n, _ in seen) or "none"
        return [f"{len(seen)} tool call(s) ({got}), expected {len(expected)} "
                f"({', '.join(repr(c.name) for c in expected) or 'none'})"]
    problems = []
    for i, (want, (name, arguments)) in enumerate(zip(expected, seen), start=1):
        if name != want.name:
            problems.append(f"tool call {i}: name {name!r}, expected {want.name!r}")
        try:
            parsed = strict_json(arguments)
        except NotStrictJson as exc:
            problems.append(f"tool call {i}: arguments are not strict JSON ({exc}): {arguments[:200]!r}")
            continue
        except ValueError as exc:
            problems.append(f"tool call {i}: arguments are not JSON ({exc}): {arguments[:200]!r}")
            continue
        if parsed != dict(want.arguments):
            problems.append(f"tool call {i}: arguments {json.dumps(parsed)}, expected {json.dumps(dict(want.arguments))}")
    return problems


def forced_token_problems(request: Request, token_ids: Mapping[str, int], seen: Observed) -> list[str]:
    """Where the answer did not spell a force_tokens text as its token: the case did not test what it names."""
    if not request.force_tokens or request.force_output is None:
        return []
    if seen.token_ids is None:
        return ["the answer carries no token ids (return_token_ids), so force_tokens cannot be checked"]
    problems = []
    for text in request.force_tokens:
        wanted, got = request.force_output.count(text), seen.token_ids.count(token_ids[text])
        if got != wanted:
            problems.append(f"the model spelled {text!r} as its token {token_ids[text]} {got} time(s), not "
                            f"{wanted}: the output did not take the path the case tests")
    return problems


def _short(text: str, limit: int = 120) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
