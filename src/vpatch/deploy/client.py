"""An HTTP client for one vLLM OpenAI-compatible server: health, metrics, tokenize, streamed requests."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vpatch.base import VpatchError
from vpatch.deploy.readings import Metrics, StreamedChat, assemble_chat, sse_events
from vpatch.serve import HttpError, Unreachable, open_url

# Lines of filler a long prompt is made of; numbered so no two lines and no two prompts share a prefix
# (a prefix-cache hit would hide the blocks a request costs).
_FILLER = "Line {n} of {nonce}: the ferry leaves the harbour at {h} and carries {k} crates of apples to the island.\n"


class ServerError(VpatchError):
    """The server under test did not answer as an OpenAI-compatible vLLM server does."""


@dataclass(frozen=True)
class Timing:
    """One streamed request, timed on the client: time to first token and decode rate after it."""

    ttft_s: float
    seconds: float
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None = None  # stop | length | abort ...; None when the stream never said

    @property
    def decode_tps(self) -> float | None:
        decode = self.seconds - self.ttft_s
        return (self.completion_tokens - 1) / decode if self.completion_tokens > 1 and decode > 0 else None


class Server:
    def __init__(self, base_url: str, *, timeout: float = 600.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._model: str | None = None

    def _open(self, path: str, body: Mapping[str, Any] | None = None, timeout: float | None = None) -> Any:
        try:
            return open_url(self.base_url + path, body, timeout=timeout or self.timeout)
        except HttpError as exc:
            raise ServerError(f"{self.base_url}{path} answered HTTP {exc.status}: {exc.body}") from exc
        except Unreachable as exc:
            raise ServerError(str(exc)) from exc

    def healthy(self) -> bool:
        try:
            with self._open("/health", timeout=5) as resp:
                return int(resp.status) == 200
        except ServerError:
            return False

    def metrics(self, *, timeout: float = 10.0) -> Metrics:
        with self._open("/metrics", timeout=timeout) as resp:
            return Metrics.parse(resp.read().decode("utf-8", "replace"))

    @property
    def model(self) -> str:
        """The served model name, as /v1/models lists it."""
        if self._model is None:
            with self._open("/v1/models", timeout=10) as resp:
                data = json.load(resp).get("data") or []
            if not data:
                raise ServerError(f"{self.base_url}/v1/models lists no model")
            self._model = str(data[0]["id"])
        return self._model

    @property
    def max_model_len(self) -> int:
        """The longest request the frontend accepts, as /v1/models says."""
        with self._open("/v1/models", timeout=10) as resp:
            data = json.load(resp).get("data") or []
        if not data or not isinstance(data[0].get("max_model_len"), int):
            raise ServerError(f"{self.base_url}/v1/models does not say max_model_len")
        return int(data[0]["max_model_len"])

    def token_ids(self, tokens: int, nonce: str) -> list[int]:
        """Exactly `tokens` prompt token ids of filler text for this server's tokenizer."""
        text = self.filler(tokens + 64, nonce)
        with self._open("/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False}) as resp:
            ids = [int(t) for t in json.load(resp)["tokens"]]
        while len(ids) < tokens:
            ids += ids[: tokens - len(ids)]
        return ids[:tokens]

    def encode(self, text: str) -> list[int]:
        """`text` as this server's tokenizer encodes it, without special tokens."""
        with self._open("/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False}) as resp:
            return [int(i) for i in json.load(resp)["tokens"]]

    def count_tokens(self, text: str) -> int:
        with self._open("/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False}) as resp:
            return int(json.load(resp)["count"])

    def filler(self, tokens: int, nonce: str) -> str:
        """Text of about `tokens` tokens for this server's tokenizer, unique to `nonce` from its first line."""
        sample = "".join(_line(n, nonce) for n in range(20))
        per_line = max(1.0, self.count_tokens(sample) / 20)
        lines = max(1, int(tokens / per_line))
        text = "".join(_line(n, nonce) for n in range(lines))
        # One correction pass: tokenizers merge differently across lines than within one.
        missing = tokens - self.count_tokens(text)
        lines = max(1, lines + int(missing / per_line))
        return "".join(_line(n, nonce) for n in range(lines))

    def complete(self, prompt: str | list[int], *, max_tokens: int, extra: Mapping[str, Any] | None = None,
                 on_token: Callable[[], None] | None = None) -> Timing:
        """A streamed completion that generates exactly `max_tokens` (EOS ignored), timed; `on_token` is
        called as each event arrives (once per engine step, while the request still holds its KV blocks)."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}, **(extra or {})}
        start = time.monotonic()
        first: float | None = None
        finish: str | None = None
        usage: dict[str, int] = {}
        with self._open("/v1/completions", body) as resp:
            for event in sse_events(_lines(resp)):
                choices = event.get("choices")
                if isinstance(choices, list) and choices:
                    if on_token is not None:
                        on_token()
                    if any(c.get("text") for c in choices):
                        first = first or time.monotonic()
                    finish = next((c["finish_reason"] for c in choices if c.get("finish_reason")), finish)
                if isinstance(event.get("usage"), dict):
                    usage = event["usage"]  # type: ignore[assignment]
        end = time.monotonic()
        return Timing((first or end) - start, end - start, int(usage.get("prompt_tokens", 0)),
                      int(usage.get("completion_tokens", 0)), finish)

    def chat(self, messages: Sequence[Mapping[str, Any]], *, max_tokens: int, extra: Mapping[str, Any] | None = None,
             on_token: Callable[[], None] | None = None) -> tuple[StreamedChat, Timing, list[str]]:
        """A streamed chat completion at temperature 0: assembled answer, timing, and the raw event lines;
        `on_token` is called as each event arrives (reasoning and tool-call deltas count: the engine works)."""
        body = {"model": self.model, "messages": list(messages), "max_tokens": max_tokens, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}, **(extra or {})}
        start = time.monotonic()
        first: float | None = None
        raw: list[str] = []
        with self._open("/v1/chat/completions", body) as resp:
            for line in _lines(resp):
                raw.append(line)
                if on_token is not None and line.startswith("data:"):
                    on_token()
                if first is None and line.startswith("data:") and ('"content":"' in line or '"tool_calls"' in line):
                    first = time.monotonic()
        end = time.monotonic()
        chat = assemble_chat(sse_events(raw))
        timing = Timing((first or end) - start, end - start, chat.prompt_tokens or 0, chat.completion_tokens or 0)
        return chat, timing, raw

    def post_json(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST `body` and return the whole JSON answer (a request with stream false)."""
        with self._open(path, body) as resp:
            answer = json.load(resp)
        if not isinstance(answer, dict):
            raise ServerError(f"{self.base_url}{path} answered {type(answer).__name__}, not a JSON object")
        return answer

    def post_stream(self, path: str, body: Mapping[str, Any]) -> list[str]:
        """POST `body` (stream true) and return the server-sent event lines as they came."""
        with self._open(path, body) as resp:
            return list(_lines(resp))


def _line(n: int, nonce: str) -> str:
    return _FILLER.format(n=n, nonce=nonce, h=f"{(n * 7) % 24:02d}:{(n * 13) % 60:02d}", k=(n * 31) % 97 + 3)


def _lines(resp: Any) -> Iterator[str]:
    for raw in resp:
        yield raw.decode("utf-8", "replace")
