"""Landing probe for 0003: does the Qwen3 parser close an unclosed <function=?

Streams malformed Qwen3 tool-call output through the tree's own Qwen3 parser
engine on the CPU, a few characters per delta, and checks what a client would
see: every tool call's streamed argument deltas concatenate to valid JSON, and
the text after the broken call still arrives as content.

Run with the tree on PYTHONPATH (vpatch runs it with cwd = the tree root).
Exit 0: every case is handled (fix present). Exit 1: a case loses arguments
or content (bug present). Exit 2: the probe could not decide, because
- Qwen3Parser or its parse_delta does not accept the arguments the probe
  drives it with, or
- the scenario did not reach the tool-call code: the well-formed CONTROL
  stream did not come out as its tool call and content.
"""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

# vpatch's probe exit codes (vpatch.probes): 0 fixed, 1 bug, 2 cannot decide.
ERROR = 2
DELTA_CHARS = 3
# A well-formed call: if the parser does not stream this one, it never reached
# its tool-call transitions and the malformed cases below say nothing.
CONTROL = (
    "well-formed tool call",
    (
        "<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n"
        "</function>\n</tool_call>\nDone."
    ),
    [("get_time", {"zone": "UTC"})],
    "Done.",
)
NEEDS = {
    "__init__": ("chat_template_kwargs",),
    "parse_delta": ("finished",),
}


class CannotDecide(Exception):
    """The tree does not let the probe build or reach its scenario."""

# (case, model output, calls a client must see, content that must follow them)
CASES = [
    (
        "function name left open before </tool_call>",
        "<tool_call>\n<function=get_weather\n</tool_call>\nIt is sunny.",
        [("get_weather", {})],
        "It is sunny.",
    ),
    (
        "function name left open before the next <tool_call>",
        (
            "<tool_call>\n<function=get_weather\n<tool_call>\n<function=get_time>\n"
            "<parameter=zone>\nUTC\n</parameter>\n</function>\n</tool_call>\nDone."
        ),
        [("get_weather", {}), ("get_time", {"zone": "UTC"})],
        "Done.",
    ),
    (
        "function name left open before the next <function=",
        (
            "<tool_call>\n<function=get_weather\n<function=get_time>\n"
            "<parameter=zone>\nUTC\n</parameter>\n</function>\n</tool_call>\nDone."
        ),
        [("get_weather", {}), ("get_time", {"zone": "UTC"})],
        "Done.",
    ),
    (
        "function body left open before the next <function=",
        (
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n"
            "</tool_call>\nDone."
        ),
        [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "UTC"})],
        "Done.",
    ),
    (
        "function body left open before the next <tool_call>",
        (
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n"
            "</function>\n</tool_call>\nDone."
        ),
        [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "UTC"})],
        "Done.",
    ),
]


class _Tokenizer:
    """Enough of a tokenizer for the parser: text terminals need no ids."""

    def get_vocab(self) -> dict[str, int]:
        return {}


def _check_api() -> None:
    import inspect

    from vllm.parser.qwen3 import Qwen3Parser

    for method, names in NEEDS.items():
        params = inspect.signature(getattr(Qwen3Parser, method)).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        rejected = [n for n in names if n not in params and not takes_any]
        if rejected:
            raise CannotDecide(
                f"Qwen3Parser.{method} does not accept {', '.join(rejected)}: "
                "update the probe"
            )


def _stream(text: str) -> tuple[list[str], str]:
    from vllm.parser.qwen3 import Qwen3Parser

    parser = Qwen3Parser(_Tokenizer(), None, chat_template_kwargs={"enable_thinking": False})
    request = SimpleNamespace(tools=None, tool_choice="auto", include_reasoning=True)
    args: dict[int, str] = {}
    names: dict[int, str] = {}
    content: list[str] = []
    pieces = [text[i : i + DELTA_CHARS] for i in range(0, len(text), DELTA_CHARS)]
    for n, piece in enumerate(pieces):
        delta = parser.parse_delta(piece, [], request, finished=n == len(pieces) - 1)
        if delta is None:
            continue
        if delta.content:
            content.append(delta.content)
        for call in delta.tool_calls or []:
            function = call.function
            if function is not None and function.name:
                names[call.index] = names.get(call.index, "") + function.name
            if function is not None and function.arguments:
                args[call.index] = args.get(call.index, "") + function.arguments
            args.setdefault(call.index, "")
    calls = [(names.get(i, ""), args[i]) for i in sorted(args)]
    return calls, "".join(content)


def _problems(text: str, expected_calls: list, expected_content: str) -> list[str]:
    calls, content = _stream(text)
    problems = []
    seen = []
    for index, (name, streamed) in enumerate(calls):
        try:
            seen.append((name.strip(), json.loads(streamed or "{}")))
        except ValueError:
            problems.append(f"tool call {index} streamed invalid JSON {streamed!r}")
    if not problems and seen != expected_calls:
        problems.append(f"tool calls {seen!r}, expected {expected_calls!r}")
    if expected_content not in content:
        problems.append(f"content after the calls was lost: got {content!r}")
    return problems


def main() -> int:
    sys.path.insert(0, os.getcwd())
    try:
        _check_api()
        control = _problems(*CONTROL[1:])
    except CannotDecide as exc:
        print(f"cannot decide: {exc}")
        return ERROR
    except Exception as exc:  # noqa: BLE001 - any failure here means "cannot decide"
        print(f"probe error on the control: {type(exc).__name__}: {exc}", file=sys.stderr)
        return ERROR
    if control:
        print("cannot decide: the well-formed control stream was mishandled, so "
              "the parser never reached its tool-call code: " + "; ".join(control))
        return ERROR
    print(f"ok   {CONTROL[0]} (control)")
    failed = 0
    for name, text, expected_calls, expected_content in CASES:
        try:
            problems = _problems(text, expected_calls, expected_content)
        except Exception as exc:  # noqa: BLE001 - any failure here means "cannot decide"
            print(f"probe error on {name!r}: {type(exc).__name__}: {exc}", file=sys.stderr)
            return ERROR
        print(f"{'ok  ' if not problems else 'FAIL'} {name}")
        for problem in problems:
            print(f"     {problem}")
        failed += bool(problems)
    if failed:
        print(f"FAIL: {failed} of {len(CASES)} malformed tool-call streams mishandled")
        return 1
    print(f"PASS: all {len(CASES)} malformed tool-call streams handled")
    return 0


if __name__ == "__main__":
    sys.exit(main())
