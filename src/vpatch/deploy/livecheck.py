"""A patch's live check (checks/live/NNNN-slug.yaml): requests to a running server and what the answers must show.

The format is typed and validated here; every error names the file and the key. Judging an answer against
a case is livejudge.py's; sending the requests is deploy/live.py's job.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, NoReturn

from vpatch.base import ConfigError
from vpatch.config import load_yaml

LIVE_DIR = "checks/live"
# Serve keys a check may require, and their types (a subset of serve:'s typed keys that change behaviour
# a check can observe; the values are compared with images/<name>.yaml's serve: section).
SERVE_KEYS: dict[str, type] = {
    "tool_call_parser": str, "enable_auto_tool_choice": bool, "reasoning_parser": str,
    "max_model_len": int, "kv_cache_dtype": str, "enable_prefix_caching": bool, "mamba_cache_mode": str,
}
_TOP = {"about", "serve", "defaults", "cases"}
_CASE = {"name", "request", "expect"}
_REQUEST = {"api", "stream", "messages", "prompt", "tools", "tool_choice", "max_tokens", "temperature", "seed",
            "structured_outputs", "force_output", "force_tokens", "extra"}
_EXPECT = {"tool_calls", "content", "content_contains", "finish_reason"}
_STRUCTURED = {"regex", "json", "choice", "grammar"}
# The logit bias that makes a forced model write a force_tokens text as its one token where the regex allows it:
# the output's text is fixed by the regex either way, only which tokens spell it changes.
FORCE_BIAS = 100
# Characters with a meaning in the regular expressions of vLLM's structured-output backends.
_REGEX_SPECIAL = set(".^$*+?()[]{}|\\")


class LiveCheckError(ConfigError):
    """A live-check file is missing, unreadable or invalid."""


class Api(str, Enum):
    CHAT = "chat"  # /v1/chat/completions
    COMPLETIONS = "completions"  # /v1/completions

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self is Api.CHAT else "/v1/completions"


@dataclass(frozen=True)
class Request:
    """One request, as the server gets it (the model name is filled in when it is sent)."""

    api: Api
    stream: bool
    max_tokens: int
    temperature: float = 0.0
    messages: tuple[Mapping[str, Any], ...] = ()
    prompt: str | None = None
    tools: tuple[Mapping[str, Any], ...] = ()
    tool_choice: str | Mapping[str, Any] | None = None
    seed: int | None = None
    structured_outputs: Mapping[str, Any] | None = None  # vLLM's: {regex | json | choice | grammar: ...}
    extra: Mapping[str, Any] = field(default_factory=dict)  # further body fields, verbatim
    force_output: str | None = None
    # Texts the forced output must spell as one token of the server's tokenizer each (e.g. "<tool_call>"): a
    # random model under a regex picks any tokens that spell the text, and a parser may take a tag by its id only.
    force_tokens: tuple[str, ...] = ()

    def body(self, model: str, token_ids: Mapping[str, int] | None = None) -> dict[str, Any]:
        """The request body; `token_ids` (each force_tokens text's id on this server) biases the model to them."""
        body: dict[str, Any] = {"model": model, "max_tokens": self.max_tokens, "temperature": self.temperature,
                                "stream": self.stream}
        if self.api is Api.CHAT:
            body["messages"] = [dict(m) for m in self.messages]
        else:
            body["prompt"] = self.prompt
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        if self.tools:
            body["tools"] = [dict(t) for t in self.tools]
        if self.tool_choice is not None:
            body["tool_choice"] = self.tool_choice
        if self.seed is not None:
            body["seed"] = self.seed
        if self.structured_outputs is not None:
            body["structured_outputs"] = dict(self.structured_outputs)
        if self.force_tokens:
            body["logit_bias"] = {str(i): FORCE_BIAS for i in (token_ids or {}).values()}
            body["return_token_ids"] = True
        return {**body, **self.extra}


@dataclass(frozen=True)
class ExpectedCall:
    name: str
    arguments: Mapping[str, Any]  # compared with the call's arguments parsed as strict JSON


@dataclass(frozen=True)
class Expect:
    """What the answer must show; None: not checked."""

    tool_calls: tuple[ExpectedCall, ...] | None = None  # () : no tool call at all
    content: str | None = None  # the content, whitespace at both ends aside
    content_contains: tuple[str, ...] = ()
    finish_reason: str | None = None


@dataclass(frozen=True)
class LiveCase:
    name: str
    request: Request
    expect: Expect


@dataclass(frozen=True)
class LiveCheck:
    path: Path
    about: str
    serve: Mapping[str, Any]  # serve: keys the server must be started with, e.g. tool_call_parser: qwen3_coder
    cases: tuple[LiveCase, ...]

    @classmethod
    def load(cls, path: Path, *, source: str | None = None) -> LiveCheck:
        where = source or str(path)
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise LiveCheckError(f"{where}: cannot read the live check: {exc.strerror or exc}",
                                 hint="a Live-Check: trailer names a file relative to the project root, "
                                 f"e.g. {LIVE_DIR}/0003-slug.yaml; keep the file when the patch is dropped") from exc
        import yaml  # lazy: PyYAML loads only when a file is read; --help reads none


        try:
            data = load_yaml(raw)
        except yaml.YAMLError as exc:
            raise LiveCheckError(f"{where}: not valid YAML: {exc}", hint="fix the YAML syntax") from exc
        return cls.parse(data, path=path, source=where)

    @classmethod
    def parse(cls, data: Any, *, path: Path, source: str) -> LiveCheck:
        v = _Validator(source)
        top = v.mapping(data, "", required={"cases"}, optional=_TOP - {"cases"})
        about = v.text(top.get("about", ""), "about", allow_empty=True)
        serve = _serve(v, top.get("serve", {}))
        defaults = v.mapping(top.get("defaults", {}), "defaults", optional=_REQUEST)
        cases_data = top["cases"]
        if not isinstance(cases_data, list) or not cases_data:
            v.fail("cases", "must be a non-empty list of {name, request, expect}")
        cases: list[LiveCase] = []
        names: set[str] = set()
        for i, item in enumerate(cases_data):
            key = f"cases[{i}]"
            case = v.mapping(item, key, required={"name", "expect"}, optional=_CASE - {"name", "expect"})
            name = v.text(case["name"], f"{key}.name")
            if name in names:
                v.fail(f"{key}.name", f"repeats the case name {name!r}; each case needs its own")
            names.add(name)
            own = v.mapping(case.get("request", {}), f"{key}.request", optional=_REQUEST)
            request = _request(v, {**defaults, **own}, f"{key}.request")
            cases.append(LiveCase(name, request, _expect(v, case["expect"], f"{key}.expect")))
        return cls(path=path, about=about, serve=serve, cases=tuple(cases))

    def serve_mismatches(self, serve: Any) -> list[str]:
        """What the server's serve: configuration lacks for this check (`serve` is a ServeConfig)."""
        out = []
        for key, wanted in self.serve.items():
            have = getattr(serve, key, None)
            if have != wanted:
                out.append(f"serve.{key} is {_yaml(have)}, the check needs {_yaml(wanted)}")
        return out


def regex_for(text: str) -> str:
    """A regular expression matching exactly `text`, in the syntax vLLM's structured-output backends share
    (Python's re.escape writes escapes such as a backslash before a newline that those backends refuse)."""
    out = []
    for ch in text:
        if ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch in _REGEX_SPECIAL:
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def _yaml(value: Any) -> str:
    return "unset" if value is None else json.dumps(value)


def _serve(v: _Validator, data: Any) -> dict[str, Any]:
    serve = v.mapping(data, "serve", optional=set(SERVE_KEYS))
    for key, value in serve.items():
        kind = SERVE_KEYS[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            v.fail(f"serve.{key}", f"must be {kind.__name__}, not {value!r}")
    return dict(serve)


def _request(v: _Validator, data: Mapping[str, Any], key: str) -> Request:
    api_text = data.get("api", Api.CHAT.value)
    if api_text not in {a.value for a in Api}:
        v.fail(f"{key}.api", f"must be chat or completions, not {api_text!r}")
    api = Api(api_text)
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        v.fail(f"{key}.stream", f"must be true or false, not {stream!r}")
    max_tokens = data.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        v.fail(f"{key}.max_tokens", f"must be a positive whole number (the answer's length limit), not {max_tokens!r}")
    temperature = data.get("temperature", 0)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0:
        v.fail(f"{key}.temperature", f"must be a number >= 0 (0: greedy, the same answer every time), not {temperature!r}")
    seed = data.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        v.fail(f"{key}.seed", f"must be a whole number, not {seed!r}")
    messages: tuple[Mapping[str, Any], ...] = ()
    prompt = None
    if api is Api.CHAT:
        if "prompt" in data:
            v.fail(f"{key}.prompt", "belongs to api: completions; a chat request has messages")
        messages = _messages(v, data.get("messages"), f"{key}.messages")
    else:
        for chat_only in ("messages", "tools", "tool_choice"):
            if chat_only in data:
                v.fail(f"{key}.{chat_only}", "belongs to api: chat")
        prompt = v.text(data.get("prompt"), f"{key}.prompt")
    tools = _tools(v, data.get("tools", []), f"{key}.tools")
    tool_choice = data.get("tool_choice")
    if tool_choice is not None and not isinstance(tool_choice, (str, dict)):
        v.fail(f"{key}.tool_choice", f"must be auto, none, required or {{type: function, function: {{name}}}}, "
               f"not {tool_choice!r}")
    structured = _structured(v, data, key)
    force = data.get("force_output")
    force_tokens = _force_tokens(v, data.get("force_tokens", []), force, f"{key}.force_tokens")
    extra = v.mapping(data.get("extra", {}), f"{key}.extra", optional=None)
    clash = sorted(set(extra) & {"model", "messages", "prompt", "stream", "max_tokens", "temperature", "tools",
                                 "tool_choice", "structured_outputs", "seed",
                                 *(("logit_bias", "return_token_ids") if force_tokens else ())})
    if clash:
        v.fail(f"{key}.extra.{clash[0]}", f"has a key of its own; write {clash[0]} in the request itself")
    return Request(api=api, stream=stream, max_tokens=max_tokens, temperature=float(temperature), messages=messages,
                   prompt=prompt, tools=tools, tool_choice=tool_choice, seed=seed, structured_outputs=structured,
                   extra=dict(extra), force_output=force, force_tokens=force_tokens)


def _force_tokens(v: _Validator, data: Any, force: Any, key: str) -> tuple[str, ...]:
    if not isinstance(data, list) or not all(isinstance(t, str) and t for t in data):
        v.fail(key, f"must be a list of non-empty texts, not {data!r}")
    if data and force is None:
        v.fail(key, "needs force_output: it says how the forced text is spelled")
    absent = [t for t in data if t not in force]
    if absent:
        v.fail(key, f"{absent[0]!r} does not occur in force_output")
    return tuple(data)


def _structured(v: _Validator, data: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    force = data.get("force_output")
    given = data.get("structured_outputs")
    if force is not None and given is not None:
        v.fail(f"{key}.force_output", "and structured_outputs both constrain the output; give one")
    if force is not None:
        return {"regex": regex_for(v.text(force, f"{key}.force_output"))}
    if given is None:
        return None
    so = v.mapping(given, f"{key}.structured_outputs", optional=_STRUCTURED)
    if len(so) != 1:
        v.fail(f"{key}.structured_outputs", f"needs exactly one of {', '.join(sorted(_STRUCTURED))}")
    (kind, value), = so.items()
    if kind in ("regex", "grammar"):
        v.text(value, f"{key}.structured_outputs.{kind}")
    elif kind == "choice" and (not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value)):
        v.fail(f"{key}.structured_outputs.choice", f"must be a non-empty list of strings, not {value!r}")
    elif kind == "json" and not isinstance(value, dict):
        v.fail(f"{key}.structured_outputs.json", "must be a JSON schema (a mapping)")
    return dict(so)


def _messages(v: _Validator, data: Any, key: str) -> tuple[Mapping[str, Any], ...]:
    if not isinstance(data, list) or not data:
        v.fail(key, "must be a non-empty list of {role, content}")
    out = []
    for i, item in enumerate(data):
        message = v.mapping(item, f"{key}[{i}]", required={"role", "content"}, optional={"name", "tool_calls",
                                                                                        "tool_call_id"})
        role = v.text(message["role"], f"{key}[{i}].role")
        if role not in ("system", "user", "assistant", "tool"):
            v.fail(f"{key}[{i}].role", f"must be system, user, assistant or tool, not {role!r}")
        v.text(message["content"], f"{key}[{i}].content", allow_empty=True)
        out.append(dict(message))
    return tuple(out)


def _tools(v: _Validator, data: Any, key: str) -> tuple[Mapping[str, Any], ...]:
    if not isinstance(data, list):
        v.fail(key, "must be a list of {type: function, function: {name, description, parameters}}")
    out = []
    for i, item in enumerate(data):
        tool = v.mapping(item, f"{key}[{i}]", required={"type", "function"}, optional=set())
        if tool["type"] != "function":
            v.fail(f"{key}[{i}].type", f"must be function, not {tool['type']!r}")
        function = v.mapping(tool["function"], f"{key}[{i}].function", required={"name"},
                             optional={"description", "parameters", "strict"})
        v.text(function["name"], f"{key}[{i}].function.name")
        if "parameters" in function and not isinstance(function["parameters"], dict):
            v.fail(f"{key}[{i}].function.parameters", "must be a JSON schema (a mapping)")
        out.append(dict(tool))
    return tuple(out)


def _expect(v: _Validator, data: Any, key: str) -> Expect:
    exp = v.mapping(data, key, optional=_EXPECT)
    if not exp:
        v.fail(key, f"says nothing the answer must show; give one of {', '.join(sorted(_EXPECT))}")
    calls: tuple[ExpectedCall, ...] | None = None
    if "tool_calls" in exp:
        items = exp["tool_calls"]
        if not isinstance(items, list):
            v.fail(f"{key}.tool_calls", "must be a list of {name, arguments} ([] : no tool call)")
        found = []
        for i, item in enumerate(items):
            call = v.mapping(item, f"{key}.tool_calls[{i}]", required={"name"}, optional={"arguments"})
            arguments = call.get("arguments", {})
            if not isinstance(arguments, dict):
                v.fail(f"{key}.tool_calls[{i}].arguments", f"must be a mapping (the JSON object expected), "
                       f"not {arguments!r}")
            found.append(ExpectedCall(v.text(call["name"], f"{key}.tool_calls[{i}].name"), dict(arguments)))
        calls = tuple(found)
    content = exp.get("content")
    if content is not None:
        content = v.text(content, f"{key}.content", allow_empty=True)
    contains = exp.get("content_contains", [])
    if isinstance(contains, str):
        contains = [contains]
    if not isinstance(contains, list) or not all(isinstance(c, str) and c for c in contains):
        v.fail(f"{key}.content_contains", f"must be a string or a list of non-empty strings, not {contains!r}")
    finish = exp.get("finish_reason")
    if finish is not None:
        finish = v.text(finish, f"{key}.finish_reason")
    return Expect(tool_calls=calls, content=content, content_contains=tuple(contains), finish_reason=finish)


class _Validator:
    """Type checks for one file, every error naming the file and the key path."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, message: str) -> NoReturn:
        where = f"{self.source}: {key}" if key else self.source
        raise LiveCheckError(f"{where}: {message}",
                             hint="see docs/live-checks.md for the format of a live check")

    def mapping(self, value: Any, key: str, *, required: set[str] = frozenset(),  # type: ignore[assignment]
                optional: set[str] | None) -> dict[str, Any]:
        """`value` as a mapping with string keys; `optional` None allows any key."""
        if not isinstance(value, dict):
            self.fail(key or "the file", f"must be a mapping, not {type(value).__name__}")
        for k in value:
            if not isinstance(k, str):
                self.fail(key, f"has a key that is not text: {k!r}")
        missing = sorted(required - set(value))
        if missing:
            self.fail(f"{key}.{missing[0]}" if key else missing[0], "is missing")
        if optional is not None:
            unknown = sorted(set(value) - required - optional)
            if unknown:
                known = ", ".join(sorted(required | optional))
                self.fail(f"{key}.{unknown[0]}" if key else unknown[0], f"is not a known key (known: {known})")
        return dict(value)

    def text(self, value: Any, key: str, *, allow_empty: bool = False) -> str:
        if not isinstance(value, str) or (not value and not allow_empty):
            self.fail(key, f"must be {'text' if allow_empty else 'non-empty text'}, not {value!r}")
        return value
