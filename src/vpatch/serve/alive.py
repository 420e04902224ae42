"""Is a vLLM server alive: /health, one 1-token completion with a timeout, and the metrics' stall rule.

Standard library only and runnable as a script: `vpatch serve` hands this very file to the container's
health check, run by the image's own python (no vpatch in the image); `serve --check` and deploy's health
step import it. /health alone is not the rule: with the engine core stopped it still answers 200 in a
millisecond, and /metrics keeps reporting its last numbers (0 running, 0 waiting).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from typing import Any

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
PROBE_PROMPT = "ping"


class Unreachable(Exception):
    """The server did not answer (refused, reset, timed out); `timed_out` tells a hang from a refusal."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class HttpError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


def open_url(url: str, body: Any = None, *, timeout: float) -> Any:
    """The one HTTP door to a vLLM server: GET, or POST of `body` as JSON; the open response."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        return urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        raise HttpError(exc.code, exc.read().decode("utf-8", "replace")[:500]) from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise Unreachable(f"{url} did not answer: {reason}", timed_out=isinstance(reason, TimeoutError)
                          or isinstance(exc, TimeoutError) or "timed out" in str(reason)) from exc


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample in a Prometheus text exposition."""
    out = []
    for line in text.splitlines():
        match = _SAMPLE.match(line) if line and not line.startswith("#") else None
        if match is None:
            continue
        labels = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(match[2] or "")}
        try:
            out.append((match[1], labels, float(match[3])))
        except ValueError:
            continue
    return out


@dataclass(frozen=True)
class Counters:
    """What the engine says it is doing: requests in flight and the tokens it has produced so far."""

    at: float  # time.time() of the scrape
    running: float
    waiting: float
    generated: float  # vllm:generation_tokens_total
    prompted: float  # vllm:prompt_tokens_total
    preemptions: float

    @classmethod
    def parse(cls, text: str, at: float) -> Counters:
        total: dict[str, float] = {}
        for name, _labels, value in samples(text):
            total[name] = total.get(name, 0.0) + value
        return cls(at, total.get("vllm:num_requests_running", 0.0), total.get("vllm:num_requests_waiting", 0.0),
                   total.get("vllm:generation_tokens_total", 0.0), total.get("vllm:prompt_tokens_total", 0.0),
                   total.get("vllm:num_preemptions_total", 0.0))

    @property
    def outstanding(self) -> float:
        return self.running + self.waiting

    def moved_since(self, earlier: Counters, own_tokens: float = 0.0) -> bool:
        """Tokens were produced since `earlier` beyond `own_tokens` (the probe's own request)."""
        return (self.generated + self.prompted) - (earlier.generated + earlier.prompted) > own_tokens

    def show(self) -> str:
        return (f"{self.running:.0f} running, {self.waiting:.0f} waiting, {self.generated:.0f} generated tokens, "
                f"{self.preemptions:.0f} preemption(s)")


@dataclass(frozen=True)
class Verdict:
    state: str  # alive | down | hung | stalled
    detail: str
    seconds: float

    @property
    def alive(self) -> bool:
        return self.state == "alive"

    def line(self) -> str:
        return f"{self.state}: {self.detail} ({self.seconds:.1f}s)"


def url_host(host: str | None) -> str:
    """The address to ask for a server listening on `host`: a wildcard (none, 0.0.0.0, ::) is asked on the
    loopback; an IPv6 literal gets its brackets (`http://::1:8000` is no URL, `http://[::1]:8000` is)."""
    if not host or host in ("0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def base_url(port: int, host: str | None = None) -> str:
    return f"http://{url_host(host)}:{port}"


def served_models(base_url: str, timeout: float) -> list[str]:
    """The model names the server at `base_url` serves (/v1/models)."""
    with open_url(f"{base_url.rstrip('/')}/v1/models", timeout=timeout) as resp:
        data = json.load(resp)
    listed = data.get("data") if isinstance(data, dict) else None
    return [str(m.get("id")) for m in listed if isinstance(m, dict)] if isinstance(listed, list) else []


def read_counters(base_url: str, timeout: float = 5.0) -> Counters:
    with open_url(f"{base_url}/metrics", timeout=timeout) as resp:
        return Counters.parse(resp.read().decode("utf-8", "replace"), time.time())


def _model(base_url: str, timeout: float) -> str:
    with open_url(f"{base_url}/v1/models", timeout=timeout) as resp:
        data = json.load(resp).get("data") or []
    if not data:
        raise HttpError(200, "/v1/models lists no model")
    return str(data[0]["id"])


def _complete_one(base_url: str, timeout: float) -> float:
    """One 1-token completion; the tokens it cost the engine (prompt + output), for the stall rule."""
    body = {"model": _model(base_url, timeout), "prompt": PROBE_PROMPT, "max_tokens": 1, "temperature": 0}
    with open_url(f"{base_url}/v1/completions", body, timeout=timeout) as resp:
        usage = json.load(resp).get("usage") or {}
    return float(usage.get("prompt_tokens", 0)) + float(usage.get("completion_tokens", 0))


def stalled_since(now: Counters, last: dict[str, Any] | None, own_tokens: float) -> float | None:
    """Since when requests have been outstanding with no token produced, from the previous check's record."""
    if now.outstanding <= 0 or last is None:
        return None
    before = Counters(**last["counters"])
    if now.moved_since(before, own_tokens):
        return None
    return float(last.get("stalled_since") or before.at)


def check(base_url: str, *, timeout: float = 20.0, stall_s: float = 30.0, state: str | None = None,
          model: str | None = None) -> Verdict:
    """One liveness verdict. A busy engine whose counters move is alive without being disturbed; an idle
    one must answer a 1-token completion within `timeout`; requests outstanding and no token for `stall_s`
    across checks (remembered in the file `state`) is a stall. With `model`, the answer must come from the
    server that serves it: another server on the port (seen: a second HTTP server on a host-network port
    answered /health and a completion while the container died on "Address already in use") is down."""
    began = time.monotonic()
    base_url = base_url.rstrip("/")

    def verdict(kind: str, detail: str) -> Verdict:
        return Verdict(kind, detail, time.monotonic() - began)

    try:
        with open_url(f"{base_url}/health", timeout=min(timeout, 5.0)) as resp:
            if int(resp.status) != 200:
                return verdict("down", f"/health answered {resp.status}")
        if model is not None:
            names = served_models(base_url, min(timeout, 5.0))
            if model not in names:
                return verdict("down", f"{base_url} answers, but not for {model!r}: its /v1/models names "
                               f"{', '.join(map(repr, names)) or 'no model'} (another server on this port?)")
        before = read_counters(base_url, timeout=min(timeout, 5.0))
    except (Unreachable, HttpError) as exc:
        return verdict("down", str(exc))
    except ValueError as exc:  # /v1/models that is no JSON: not a vLLM server
        return verdict("down", f"{base_url}/v1/models is not a vLLM answer: {exc}")
    last = load_state(state)
    own = 0.0
    if before.outstanding <= 0 or last is None or not before.moved_since(Counters(**last["counters"])):
        # Idle, or busy with nothing to show for it since the last check: ask for one token.
        try:
            own = _complete_one(base_url, timeout)
        except Unreachable as exc:
            if exc.timed_out:
                return verdict("hung", f"/health answers 200 but a 1-token completion got no answer in {timeout:.0f}s; "
                               f"metrics: {before.show()}")
            return verdict("down", str(exc))
        except HttpError as exc:
            return verdict("down", f"a 1-token completion failed: {exc}")
    try:
        now = read_counters(base_url, timeout=min(timeout, 5.0))
    except (Unreachable, HttpError) as exc:
        return verdict("down", str(exc))
    since = stalled_since(now, last, own)
    save_state(state, {"counters": asdict(now), "stalled_since": since})
    if since is not None and now.at - since >= stall_s:
        return verdict("stalled", f"{now.outstanding:.0f} request(s) outstanding and no token for "
                       f"{now.at - since:.0f}s (stall_s {stall_s:.0f}); metrics: {now.show()}")
    return verdict("alive", f"answers; metrics: {now.show()}")


def load_state(path: str | None) -> dict[str, Any] | None:
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) and isinstance(data.get("counters"), dict) else None
    except (OSError, ValueError):
        return None


def save_state(path: str | None, data: dict[str, Any]) -> None:
    if not path:
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only filesystem loses the stall memory, not the verdict


def main(argv: list[str]) -> int:
    """`python alive.py URL [--timeout S] [--stall-s S] [--state FILE] [--model NAME]`: one line, exit 0 alive / 1 not."""
    options = {"--timeout": 20.0, "--stall-s": 30.0}
    state = model = None
    url = "http://127.0.0.1:8000"
    args = iter(argv)
    for arg in args:
        if arg in options:
            options[arg] = float(next(args))
        elif arg == "--state":
            state = next(args)
        elif arg == "--model":
            model = next(args)
        else:
            url = arg
    result = check(url, timeout=options["--timeout"], stall_s=options["--stall-s"], state=state, model=model)
    print(result.line(), flush=True)
    return 0 if result.alive else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
