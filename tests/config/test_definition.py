"""images/<name>.yaml as one model: every rule `validate()` checks before serve or deploy touches anything.

Config-only rules: no server is needed to show them (test_config_before_parking.py shows, against the real
CPU server, that a deploy refused by them leaves production untouched)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vpatch.base.errors import ConfigError
from vpatch.commands.cli import app
from vpatch.config.definition import ImageDefinition
from vpatch.serve.render import for_definition

HEAD = "image:\n  repository: test/vllm\n  tag: tiny\n"
SERVE = "serve:\n  model: /models/tiny\n  max_model_len: 1024\n"


def write(root: Path, body: str, name: str = "tiny") -> Path:
    (root / "images").mkdir(exist_ok=True)
    path = root / "images" / f"{name}.yaml"
    path.write_text(HEAD + body)
    return path


def validated(root: Path, body: str) -> ImageDefinition:
    write(root, body)
    return ImageDefinition.load(root, "tiny").validate()


def refused(root: Path, body: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        validated(root, body)
    assert "images/tiny.yaml" in info.value.message, info.value.message
    assert info.value.hint, info.value.message
    return info.value


def test_env_values_and_args_are_taken_as_written(tmp_path: Path) -> None:
    definition = validated(tmp_path, SERVE + """  command: [vllm, serve]
  extra_args: [--max-num-seqs, 010, --seed, 0x1F]
  env:
    CUDA_VISIBLE_DEVICES: 0123
    TORCH_VERSION: 2.10
    SOME_TIME: 1:30
    HF_HUB_OFFLINE: on
    QUOTED: "007"
    EMPTY: ""
""")
    command = for_definition(definition)
    envs = [command.argv[i + 1] for i, a in enumerate(command.argv) if a == "--env"]
    # YAML 1.1 would have made these 83, 2.1, 90 and True (rendered "1"), and 010 the number 8.
    assert envs == ["CUDA_VISIBLE_DEVICES=0123", "TORCH_VERSION=2.10", "SOME_TIME=1:30", "HF_HUB_OFFLINE=on",
                    "QUOTED=007", "EMPTY="]
    assert command.args[-4:] == ("--max-num-seqs", "010", "--seed", "0x1F")


def test_a_null_env_value_is_refused_with_the_way_to_write_empty(tmp_path: Path) -> None:
    error = refused(tmp_path, SERVE + "  env:\n    HF_TOKEN:\n")
    assert "serve.env.HF_TOKEN' is empty (null)" in error.message and '""' in (error.hint or "")


def test_unquoted_no_gets_a_hint_to_quote_it(tmp_path: Path) -> None:
    error = refused(tmp_path, SERVE + "  container:\n    restart: no\n")
    assert "serve.container.restart' must be a string" in error.message and "unquoted no" in error.message
    assert error.hint == 'quote it: restart: "no"'


@pytest.mark.parametrize(("body", "key"), [
    (SERVE + "  gpu_memory_utilization: .nan\n", "serve.gpu_memory_utilization"),
    (SERVE + "  gpu_memory_utilization: .inf\n", "serve.gpu_memory_utilization"),
    ("deploy:\n  start_watch_s: .nan\n", "deploy.start_watch_s"),
    ("deploy:\n  health_timeout_s: .inf\n", "deploy.health_timeout_s"),
    ("deploy:\n  checks:\n    kv_pool: {min_tokens: 10, min_concurrency: .nan}\n", "deploy.checks.kv_pool.min_concurrency"),
    ("deploy:\n  checks:\n    kv_pool: {min_tokens: 10, max_drop: .NaN}\n", "deploy.checks.kv_pool.max_drop"),
    ("deploy:\n  checks:\n    block_cost: {prompt_tokens: 10, max_ratio: .nan}\n", "deploy.checks.block_cost.max_ratio"),
])
def test_nan_and_inf_are_refused(tmp_path: Path, body: str, key: str) -> None:
    error = refused(tmp_path, body)
    assert f"key '{key}' must be a finite positive number" in error.message
    assert ".nan" in error.message.lower() or ".inf" in error.message


@pytest.mark.parametrize(("body", "key"), [
    (SERVE + "  container: []\n", "serve.container"),
    (SERVE + "  container: false\n", "serve.container"),
    (SERVE + "  container:\n", "serve.container"),
    (SERVE + "  env: {}\n", "serve.env"),
    ("serve:\n", "serve"),
    ("serve: []\n", "serve"),
    ("deploy: []\n", "deploy"),
    ("deploy:\n  checks: false\n", "deploy.checks"),
    ("deploy:\n  hooks: 0\n", "deploy.hooks"),
    ("deploy:\n  checks:\n    kv_pool:\n", "deploy.checks.kv_pool"),
    ("deploy:\n  checks:\n    log_scan: {}\n", "deploy.checks.log_scan"),
    ("deploy:\n  hooks:\n    before_switch: false\n", "deploy.hooks.before_switch"),
    ("base: {}\n", "base"),
    ("source_build: []\n", "source_build"),
])
def test_present_but_empty_sections_are_errors_not_defaults(tmp_path: Path, body: str, key: str) -> None:
    message = refused(tmp_path, body).message
    assert f"key '{key}'" in message
    assert "False" not in message and "None" not in message  # YAML's words (false, null), not Python's


def test_an_empty_tool_call_mapping_still_means_the_check_with_its_defaults(tmp_path: Path) -> None:
    definition = validated(tmp_path, SERVE + "  enable_auto_tool_choice: true\n  tool_call_parser: hermes\n"
                           "deploy:\n  checks:\n    tool_call: {}\n")
    assert definition.deploy.tool_call is not None


@pytest.mark.parametrize(("checks", "key", "tokens"), [
    ("parallel: {requests: 2, prompt_tokens: 300000}", "deploy.checks.parallel", "300,064"),
    ("needles: {lengths: [500, 2000]}", "deploy.checks.needles", "2,032"),
    ("block_cost: {prompt_tokens: 1000, max_tokens: 64}", "deploy.checks.block_cost", "1,064"),
    ("questions: {file: q.yaml, min_right: 0, max_tokens: 2048}", "deploy.checks.questions", "2,048"),
])
def test_requests_larger_than_max_model_len_are_refused_before_anything_starts(
        tmp_path: Path, checks: str, key: str, tokens: str) -> None:
    (tmp_path / "q.yaml").write_text("- {ask: a, expect: b}\n")
    error = refused(tmp_path, SERVE + f"deploy:\n  checks:\n    {checks}\n")
    assert f"{key} sends requests of" in error.message and f"= {tokens} tokens" in error.message
    assert "max_model_len 1,024 (serve.max_model_len)" in error.message and "HTTP 400" in error.message
    assert "nothing was started or stopped" in (error.hint or "")


def test_every_disagreement_is_listed_at_once_and_max_model_len_counts_from_extra_args(tmp_path: Path) -> None:
    body = ("serve:\n  model: m\n  extra_args: [--max_model_len=512]\n"
            "deploy:\n  checks:\n    parallel: {requests: 2, prompt_tokens: 600}\n    needles: {lengths: [700]}\n"
            "    tool_call: {}\n")
    error = refused(tmp_path, body)
    assert "(3 problems)" in error.message
    assert "max_model_len 512 (serve.extra_args[0])" in error.message
    assert "deploy.checks.parallel" in error.message and "deploy.checks.needles" in error.message
    assert "deploy.checks.tool_call needs a server that takes tool calls" in error.message


def test_requests_that_fit_pass(tmp_path: Path) -> None:
    definition = validated(tmp_path, SERVE + "deploy:\n  checks:\n    parallel: {requests: 4, prompt_tokens: 900, "
                           "max_tokens: 124}\n    needles: {lengths: [600], max_tokens: 16}\n")
    assert definition.deploy.parallel is not None and definition.deploy.needles is not None


def test_tool_parser_and_auto_tool_choice_must_agree(tmp_path: Path) -> None:
    error = refused(tmp_path, SERVE + "  enable_auto_tool_choice: false\n  tool_call_parser: hermes\n")
    assert "serve.enable_auto_tool_choice' is false while a tool parser is set" in error.message
    error = refused(tmp_path, SERVE + "  enable_auto_tool_choice: true\n")
    assert "serve.enable_auto_tool_choice' is true without a tool parser" in error.message
    # given through extra_args, the same rules hold
    error = refused(tmp_path, SERVE + "  tool_call_parser: hermes\n  extra_args: [--no-enable-auto-tool-choice]\n")
    assert "serve.extra_args[0]' is false while a tool parser is set" in error.message
    validated(tmp_path, SERVE + "  tool_call_parser: hermes\n  extra_args: [--enable-auto-tool-choice]\n")


@pytest.mark.parametrize(("extra", "where", "first"), [
    ('[--max-model-len, "2048"]', "serve.extra_args[0]", "serve.max_model_len"),
    ("[--max_model_len=4096]", "serve.extra_args[0]", "serve.max_model_len"),
    ("[--max-model-len=4096]", "serve.extra_args[0]", "serve.max_model_len"),
    ("[--seed, 1, --trust-remote-code, --seed=2]", "serve.extra_args[3]", "serve.extra_args[0]"),
    ("[--no-enforce_eager]", "serve.extra_args[0]", "serve.enforce_eager"),
])
def test_a_flag_given_twice_is_refused_in_any_spelling(tmp_path: Path, extra: str, where: str, first: str) -> None:
    error = refused(tmp_path, SERVE + f"  enforce_eager: true\n  extra_args: {extra}\n")
    assert f"key '{where}' gives" in error.message and f"({first} gives it already)" in error.message


def test_port_in_extra_args_is_refused_for_serve_port(tmp_path: Path) -> None:
    for extra in ("[--port, '9000']", "[--port=9000]"):
        error = refused(tmp_path, SERVE + f"  port: 8000\n  extra_args: {extra}\n")
        assert "gives --port again: serve.port (8000) is the port vLLM listens on" in error.message
        assert error.hint == "remove it and set serve.port"
    # even without port: (vpatch always renders --port, 8000 by default)
    assert "gives --port again" in refused(tmp_path, SERVE + "  extra_args: [--port, '9000']\n").message


@pytest.mark.parametrize(("body", "key"), [
    ('  command: ["serve "]\n', "serve.command[0]"),
    ("  command: [Serve]\n", "serve.command[0]"),
    ('  command: ["vllm serve"]\n', "serve.command[0]"),
    ("  command: [vllm, serve, serve]\n", "serve.command"),
    ("  extra_args: [serve]\n", "serve.extra_args[0]"),
    ("  extra_args: [--enforce-eager, SERVE]\n", "serve.extra_args[1]"),
])
def test_serve_twice_is_refused_in_every_spelling(tmp_path: Path, body: str, key: str) -> None:
    assert f"key '{key}'" in refused(tmp_path, SERVE + body).message


def test_a_model_beginning_with_serve_is_refused(tmp_path: Path) -> None:
    error = refused(tmp_path, 'serve:\n  model: "serve /models/x"\n')
    assert "serve.model' begins with `serve`" in error.message


def test_serve_as_a_flag_value_is_fine(tmp_path: Path) -> None:
    definition = validated(tmp_path, SERVE + "  extra_args: [--served-model-name, serve]\n")
    assert definition.serve is not None and definition.serve.flag("--served_model_name") is not None


def test_deeply_nested_yaml_is_a_clear_error(tmp_path: Path) -> None:
    write(tmp_path, "serve:\n  model: m\n  env: " + "[" * 3000 + "]" * 3000 + "\n")
    with pytest.raises(ConfigError, match="nested more deeply than vpatch reads"):
        ImageDefinition.load(tmp_path, "tiny")


def test_question_files_are_read_like_every_vpatch_file(tmp_path: Path) -> None:
    body = SERVE + "deploy:\n  checks:\n    questions: {file: q.yaml, min_right: 1}\n"
    (tmp_path / "q.yaml").write_text("- ask: Is water wet?\n  expect: [yes, 1.10, 'on']\n")
    (question,) = validated(tmp_path, body).deploy.questions.questions  # type: ignore[union-attr]
    assert question.expect == ("yes", "1.10", "on")  # YAML 1.1 would give True, 1.1 and True
    for text, message in [("- ask: a\n  expect: b\n  expect: c\n", "the key 'expect' appears twice"),
                          ("- ask: a\n  expect: ''\n", "holds an empty answer"),
                          ("- ask: a\n  expect: ['x', ' ']\n", "holds an empty answer"),
                          ("- ask: a\n  expect: []\n", "is an empty list"),
                          ("- ask: a\n  expect:\n", "is empty (null)"),
                          ("- ask: a\n  expect: [{x: 1}]\n", "must be a string")]:
        (tmp_path / "q.yaml").write_text(text)
        with pytest.raises(ConfigError) as info:
            validated(tmp_path, body)
        assert info.value.message.startswith("q.yaml: ") and message in info.value.message, info.value.message


def test_the_image_part_loads_without_parsing_serve_or_deploy(tmp_path: Path) -> None:
    """build and status need only the image part: a broken deploy: section fails where it is used."""
    write(tmp_path, "deploy:\n  checks: false\nserve: []\n")
    definition = ImageDefinition.load(tmp_path, "tiny")
    assert definition.moving_ref == "test/vllm:tiny"
    with pytest.raises(ConfigError, match=r"key 'deploy\.checks'"):
        definition.deploy  # noqa: B018
    with pytest.raises(ConfigError, match="key 'serve'"):
        definition.validate()


def test_loading_a_definition_imports_neither_serve_nor_deploy() -> None:
    code = ("import sys; from pathlib import Path; from vpatch.config.definition import ImageDefinition; "
            "d = ImageDefinition.load(Path('.'), 'flash-next'); print(d.moving_ref); "
            "print(sorted(m for m in sys.modules if m.startswith(('vpatch.serve', 'vpatch.deploy'))))")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["localhost:5000/ml/vllm-flash:flash-next", "[]"]


def test_serve_print_runs_the_whole_validation_pass(tmp_path: Path) -> None:
    (tmp_path / "vpatch.yaml").write_text("pin:\n  ref: v1.0\n")
    write(tmp_path, SERVE + "deploy:\n  checks:\n    parallel: {requests: 2, prompt_tokens: 300000}\n")
    result = CliRunner().invoke(app, ["-C", str(tmp_path), "serve", "tiny", "--print"])
    assert result.exit_code == 1 and "deploy.checks.parallel sends requests" in result.output
    assert "docker run" not in result.stdout


def test_the_shipped_definition_validates() -> None:
    root = Path(__file__).resolve().parents[2]
    definition = ImageDefinition.load(root, "flash-next").validate()
    assert definition.serve is not None and definition.deploy.questions is not None


@pytest.mark.parametrize(("body", "key", "says"), [
    ("deploy:\n  checks:\n    timing: {repeats: 2}\n", "deploy.checks.timing.repeats", "fewer than 3 a side"),
    ("deploy:\n  checks:\n    timing: {min_change: 1.5}\n", "deploy.checks.timing.min_change", "below 1"),
    ("deploy:\n  checks:\n    timing: {repetitions: 5}\n", "deploy.checks.timing", "repetitions"),
])
def test_the_timing_check_refuses_repeats_no_rule_can_judge(tmp_path: Path, body: str, key: str, says: str) -> None:
    error = refused(tmp_path, body)
    assert key in error.message and says in error.message, error.message


def test_the_timing_check_has_defaults_that_are_cheap() -> None:
    from vpatch.config.deploy import Suite

    suite = Suite.parse({"checks": {"timing": {}}}, root=Path("."), source="images/x.yaml")
    assert suite.timing is not None and suite.timing.repeats == 5 and suite.timing.long_prompt_tokens is None
    assert [s.key for s in suite.request_sizes()] == ["deploy.checks.timing"]
