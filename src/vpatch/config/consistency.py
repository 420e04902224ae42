"""The rules between serve: and deploy: in one image definition, checked before anything starts: a check
whose requests the server must refuse, or a tool-call check on a server without tools, would otherwise be
found only after production is parked (on the GPU host: a 15-minute outage for a configuration error)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vpatch.base import ConfigError

if TYPE_CHECKING:
    from vpatch.config.deploy import Suite
    from vpatch.config.serve import ServeConfig


def problems(serve: ServeConfig | None, suite: Suite) -> list[str]:
    """Every serve: x deploy: rule that fails, one sentence each (empty when they all hold)."""
    if serve is None:
        return []  # deploy refuses a definition without serve:, with its own message
    out = []
    length = serve.flag("--max-model-len")
    if length is not None and length.value is not None and length.value.isdigit():
        limit = int(length.value)
        for size in suite.request_sizes():
            if size.tokens > limit:
                prompt = f"{size.prompt_tokens:,} prompt + " if size.prompt_tokens else ""
                out.append(f"{size.key} sends requests of {prompt}{size.max_tokens:,} max_tokens = {size.tokens:,} "
                           f"tokens, more than max_model_len {limit:,} ({length.where}): vLLM refuses them (HTTP 400)")
    if suite.tool_call is not None:
        parser, auto = serve.flag("--tool-call-parser"), serve.flag("--enable-auto-tool-choice")
        if parser is None or auto is None or auto.negated:
            out.append("deploy.checks.tool_call needs a server that takes tool calls: serve.tool_call_parser and "
                       "serve.enable_auto_tool_choice: true" + ("" if parser is None else f" (a parser is set in "
                                                               f"{parser.where}, auto tool choice is not on)"))
    return out


def check(serve: ServeConfig | None, suite: Suite, *, source: str) -> None:
    """ConfigError listing every failed rule; nothing when they all hold."""
    found = problems(serve, suite)
    if found:
        lines = "\n".join(f"  - {p}" for p in found)
        raise ConfigError(f"{source}: serve: and deploy: disagree ({len(found)} problem{'s' * (len(found) > 1)}):\n"
                          f"{lines}", hint=f"fix them in {source}; nothing was started or stopped")
