"""A definition that can never deploy is refused before production is touched: against a real production
server (the vLLM 0.32.0 CPU server image: the session's `tiny_production`, shared with the serve and deploy
tests), each bad images/tiny.yaml makes `vpatch deploy` exit 1 naming the key, and production is the same
container (id and start time), still healthy, with no deploy journal written. On the GPU host each of these
cost a 15-minute outage before.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.deployhost import Host
from helpers.serverimage import tiny_serve, write_project
from typer.testing import CliRunner

from vpatch.commands.cli import app
from vpatch.deploy.client import Server
from vpatch.docker import Docker

pytestmark = pytest.mark.docker

NAME = "tiny"
# The tiny Qwen3 costs 1 KiB of KV per token (tests/helpers/serverimage.py): 8 MiB hold 8,192 tokens.
KV_BYTES = 8 * 1024 * 1024


@dataclass
class Production:
    root: Path
    image: str
    port: int
    container: str
    id: str
    started_at: str
    env: dict[str, str]

    def write(self, serve: dict[str, Any], deploy: dict[str, Any] | None = None, *, raw: str = "") -> None:
        """images/tiny.yaml with `serve` (and `deploy`), then `raw` appended as written (for YAML a dict cannot say)."""
        write_project(self.root, self.image, serve, name=NAME)
        path = self.root / "images" / f"{NAME}.yaml"
        doc = yaml.safe_load(path.read_text())
        if deploy is not None:
            doc["deploy"] = deploy
        path.write_text(yaml.safe_dump(doc, sort_keys=False) + raw)

    def serve(self, **overrides: Any) -> dict[str, Any]:
        serve = tiny_serve(self.port, self.container, kv_cache_memory_bytes=KV_BYTES, **overrides)
        serve["container"]["restart"] = "unless-stopped"
        return serve

    def deploy(self, *args: str) -> tuple[int, str]:
        result = CliRunner().invoke(app, ["-C", str(self.root), "deploy", NAME, *args], env=self.env)
        return result.exit_code, result.output

    def assert_untouched(self) -> None:
        info = Docker.connect().container(self.container)
        assert info is not None and (info.id, info.started_at) == (self.id, self.started_at)
        assert info.status == "running" and info.restart_policy == "unless-stopped"
        assert Server(f"http://127.0.0.1:{self.port}").healthy()
        assert not (Path(self.env["VPATCH_STATE"]) / "deploy" / f"{NAME}.json").exists()  # no journal begun


@pytest.fixture
def production(tiny_production: Host) -> Production:
    """The shared production server as this module's tests see it: its container's id and start time now."""
    info = tiny_production.docker.container(tiny_production.container)
    assert info is not None
    return Production(tiny_production.root, tiny_production.image, tiny_production.port, tiny_production.container,
                      info.id, info.started_at, tiny_production.env)


CASES: list[tuple[str, dict[str, Any], dict[str, Any] | None, str, str]] = [
    # (id, serve overrides, deploy section, raw yaml appended, what the error says)
    ("parallel-too-long", {}, {"checks": {"parallel": {"requests": 2, "prompt_tokens": 300000}}}, "",
     "deploy.checks.parallel sends requests of 300,000 prompt + 64 max_tokens = 300,064 tokens, more than "
     "max_model_len 1,024 (serve.max_model_len)"),
    ("needles-too-long", {}, {"checks": {"needles": {"lengths": [600, 5000]}}}, "",
     "deploy.checks.needles sends requests of 5,000 prompt + 32 max_tokens"),
    ("block-cost-too-long", {}, {"checks": {"block_cost": {"prompt_tokens": 2000}}}, "",
     "deploy.checks.block_cost sends requests of 2,000 prompt"),
    ("tool-call-without-parser", {}, {"checks": {"tool_call": {}}}, "",
     "deploy.checks.tool_call needs a server that takes tool calls"),
    ("auto-tool-choice-false", {"enable_auto_tool_choice": False, "tool_call_parser": "hermes"}, None, "",
     "key 'serve.enable_auto_tool_choice' is false while a tool parser is set"),
    ("flag-twice", {"extra_args": ["--max-model-len", "2048"]}, None, "",
     "key 'serve.extra_args[0]' gives --max-model-len a second time (serve.max_model_len gives it already)"),
    ("flag-twice-underscore", {"extra_args": ["--max_model_len=4096"]}, None, "",
     "gives --max-model-len a second time"),
    ("port-in-extra-args", {"extra_args": ["--port", "9"]}, None, "", "gives --port again"),
    ("serve-capitalised", {"command": ["Serve"]}, None, "", "key 'serve.command[0]' is 'Serve', not the word `serve`"),
    ("serve-in-extra-args", {"extra_args": ["serve"]}, None, "", "key 'serve.extra_args[0]' is 'serve'"),
    ("nan-start-watch", {}, None, "deploy:\n  start_watch_s: .nan\n",
     "key 'deploy.start_watch_s' must be a finite positive number, not .nan"),
    ("empty-checks", {}, None, "deploy:\n  checks: false\n", "key 'deploy.checks' is false"),
    ("questions-duplicate-expect", {}, {"checks": {"questions": {"file": "checks/dup.yaml", "min_right": 0}}}, "",
     "the key 'expect' appears twice"),
    ("questions-empty-expect", {}, {"checks": {"questions": {"file": "checks/empty.yaml", "min_right": 0}}}, "",
     "checks/empty.yaml: key '[0].expect' holds an empty answer"),
]


@pytest.mark.parametrize(("serve", "deploy", "raw", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refused_before_production_is_touched(production: Production, serve: dict[str, Any],
                                              deploy: dict[str, Any] | None, raw: str, message: str) -> None:
    (production.root / "checks" / "dup.yaml").write_text("- ask: a\n  expect: b\n  expect: c\n")
    (production.root / "checks" / "empty.yaml").write_text("- {ask: a, expect: ''}\n")
    production.write(production.serve(**serve), deploy, raw=raw)
    code, output = production.deploy()
    assert code == 1, output
    assert message in output and "hint:" in output, output
    assert "Traceback" not in output and "internal error" not in output
    production.assert_untouched()


def test_unquoted_restart_no_is_refused_with_the_quote_to_add(production: Production) -> None:
    production.write(production.serve())
    path = production.root / "images" / f"{NAME}.yaml"
    path.write_text(path.read_text().replace("restart: unless-stopped", "restart: no"))
    code, output = production.deploy()
    assert code == 1 and "key 'serve.container.restart' must be a string" in output
    assert 'hint: quote it: restart: "no"' in output
    production.assert_untouched()


def test_a_journal_field_of_the_wrong_type_is_a_clear_error_in_status_and_rollback(production: Production) -> None:
    production.write(production.serve())
    folder = Path(production.env["VPATCH_STATE"]) / "deploy"
    folder.mkdir(parents=True, exist_ok=True)
    journal = folder / f"{NAME}.json"
    journal.write_text(json.dumps({"definition": NAME, "container": production.container, "image": production.image,
                                   "phase": "checking", "started": "20260924-201500", "parked_id": 12345}))
    try:
        for args in (["--status"], ["--rollback"]):
            code, output = production.deploy(*args)
            assert code == 1, output
            assert "field 'parked_id' must be a non-empty string or null, not 12345" in output
            assert "Traceback" not in output and "internal error" not in output
    finally:
        journal.unlink()
    production.assert_untouched()
