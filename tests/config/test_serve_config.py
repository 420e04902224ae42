"""serve: in images/<name>.yaml: validated with the key named, rendered into one exact `docker run`."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vpatch.base.errors import ConfigError
from vpatch.commands.cli import app
from vpatch.config.definition import ImageDefinition
from vpatch.serve.render import LABEL_DEFINITION, for_definition, for_serve

ROOT = Path(__file__).resolve().parents[2]
HEAD = "image:\n  repository: test/vllm\n  tag: tiny\n"


def load(tmp_path: Path, serve: str, name: str = "tiny") -> ImageDefinition:
    (tmp_path / "images").mkdir(exist_ok=True)
    (tmp_path / "images" / f"{name}.yaml").write_text(HEAD + serve)
    return ImageDefinition.load(tmp_path, name).validate()


def flags(argv: list[str]) -> dict[str, str]:
    """--flag value pairs; a flag followed by another flag (or nothing) maps to ''."""
    out = {}
    for i, word in enumerate(argv):
        if word.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else "--"
            out[word] = "" if nxt.startswith("--") else nxt
    return out


def test_flash_next_prints_the_production_command() -> None:
    result = CliRunner().invoke(app, ["-C", str(ROOT), "serve", "flash-next", "--print"])
    assert result.exit_code == 0, result.output
    run, update = result.stdout.splitlines()
    argv = shlex.split(run)
    assert argv[:3] == ["docker", "run", "--detach"]
    image = argv.index("localhost:5000/ml/vllm-flash:flash-next")
    options, args = argv[:image], argv[image + 1:]
    # The write-ups' values: 4 GPUs with TP 4 and expert parallelism, 220,000 tokens, 8 slots, FP8 KV,
    # 7,440,208,896 bytes of KV per card, 2,048-token prefill chunks.
    pairs = flags(args[1:])
    assert args[0] == "/models/Qwen3.8-Flash-Next"
    assert pairs["--tensor-parallel-size"] == "4" and "--enable-expert-parallel" in args
    assert pairs["--max-model-len"] == "220000" and pairs["--max-num-seqs"] == "8"
    assert pairs["--kv-cache-dtype"] == "fp8" and pairs["--kv-cache-memory-bytes"] == "7440208896"
    assert pairs["--max-num-batched-tokens"] == "2048"
    assert "serve" not in args  # the official image's entrypoint already is `vllm serve`
    opts = flags(options[3:])
    # It starts with restart no and gets the yaml's unless-stopped once alive: a start that dies is not restarted.
    assert opts["--restart"] == "no" and opts["--ipc"] == "host" and opts["--gpus"] == "all"
    assert update == "docker update --restart unless-stopped vllm-flash-next   # once alive"
    assert opts["--label"] == f"{LABEL_DEFINITION}=flash-next" and opts["--name"] == "vllm-flash-next"
    # The docker health check: the liveness rule run by the image's python3 against its own port; the weights
    # take ~15 minutes to load, so failures within serve.health_timeout (1,500 s) do not count.
    assert opts["--health-cmd"].startswith("python3 -c ") and "http://127.0.0.1:8000 --timeout 15" in opts["--health-cmd"]
    assert opts["--health-start-period"] == "1500s" and opts["--health-retries"] == "3"


def test_render_order_env_and_container_options(tmp_path: Path) -> None:
    definition = load(tmp_path, """serve:
  model: /models/tiny
  port: 8123
  max_model_len: 1024
  enforce_eager: true
  enable_prefix_caching: false
  extra_args: ["--seed", 7]
  env:
    VLLM_CPU_KVCACHE_SPACE: 1
    HF_HUB_OFFLINE: true
  container:
    name: vpatch-test-tiny
    gpus: device=0,2
    shm_size: 1g
    network: host
    restart: "no"
""")
    command = for_definition(definition, image="local/other:1")
    assert command.name == "vpatch-test-tiny" and command.image == "local/other:1"
    assert command.args == ("/models/tiny", "--port", "8123", "--max-model-len", "1024",
                            "--no-enable-prefix-caching", "--enforce-eager", "--seed", "7")
    argv = command.argv
    assert argv[argv.index("--gpus") + 1] == '"device=0,2"'  # one CSV field for the docker CLI
    assert "--publish" not in argv  # host network: the port is the host's
    envs = [argv[i + 1] for i, a in enumerate(argv) if a == "--env"]
    # As written in the yaml: `true` stays "true" (no YAML 1.1 rewriting; see test_serve_values_as_written)
    assert envs == ["VLLM_CPU_KVCACHE_SPACE=1", "HF_HUB_OFFLINE=true"]
    assert argv[argv.index("local/other:1") + 1:] == command.args
    # deploy starts a candidate under another name and restart policy, same configuration otherwise
    other = for_definition(definition, image="local/other:1", name="cand", restart="no")
    assert other.name == "cand" and other.args == command.args


def test_default_container_name_and_published_port(tmp_path: Path) -> None:
    command = for_definition(load(tmp_path, "serve:\n  model: m\n"))
    argv = command.argv
    assert command.name == "vllm-tiny" and argv[argv.index("--publish") + 1] == "8000:8000"
    assert argv[argv.index("--restart") + 1] == "unless-stopped"
    assert command.args == ("m", "--port", "8000")


def test_serve_starts_with_restart_no_and_gives_the_yaml_policy_once_alive(tmp_path: Path) -> None:
    """A server that dies at start must be one start: docker restarts nothing until vpatch saw it alive."""
    definition = load(tmp_path, "serve:\n  model: m\n  container:\n    restart: on-failure:3\n")
    served = for_serve(definition)
    argv = served.argv
    assert argv[argv.index("--restart") + 1] == "no" and served.restart_once_alive == "on-failure:3"
    assert served.shell_lines() == [served.shell_line(), "docker update --restart on-failure:3 vllm-tiny   # once alive"]
    # Apart from the policy, the very run the yaml renders.
    yaml_run = list(for_definition(definition).argv)
    assert yaml_run[yaml_run.index("--restart") + 1] == "on-failure:3"
    yaml_run[yaml_run.index("--restart") + 1] = "no"
    assert list(argv) == yaml_run
    # A yaml that says "no" has nothing to give later: --print shows the one run.
    never = for_serve(load(tmp_path, 'serve:\n  model: m\n  container:\n    restart: "no"\n'))
    assert never.restart_once_alive is None and never.shell_lines() == [never.shell_line()]


@pytest.mark.parametrize(
    ("serve", "message"),
    [
        ("serve:\n  port: 8000\n", "key 'serve.model' is missing"),
        ("serve:\n  model: m\n  max_model_lenght: 10\n", "key 'serve.max_model_lenght' is not a known key"),
        ("serve:\n  model: m\n  max_model_len: 220k\n", "key 'serve.max_model_len' must be a positive whole number, not 220k"),
        ("serve:\n  model: m\n  max_num_seqs: 0\n", "key 'serve.max_num_seqs' must be a positive"),
        ("serve:\n  model: m\n  port: 70000\n", "key 'serve.port' must be a TCP port"),
        ("serve:\n  model: m\n  enforce_eager: yes please\n", "key 'serve.enforce_eager' must be true or false"),
        ("serve:\n  model: m\n  tool_call_parser: hermes\n", "key 'serve.enable_auto_tool_choice' must be set"),
        ("serve:\n  model: m\n  extra_args: --x\n", "key 'serve.extra_args' must be a list"),
        ("serve:\n  model: m\n  env:\n    1BAD: x\n", "key 'serve.env.1BAD' is not a valid environment"),
        # The kind as YAML names it, never the loader's class (it said "not a TextList").
        ("serve:\n  model: m\n  env:\n    A: [1]\n", "key 'serve.env.A' must be a string or number, not a list"),
        ("serve:\n  model: m\n  env:\n    A: {b: 1}\n", "key 'serve.env.A' must be a string or number, not a mapping"),
        ("serve:\n  model: m\n  env: [A]\n", "key 'serve.env' must be a mapping of NAME: value (leave the key out "
         "for none), not a list"),
        ("serve:\n  model: m\n  container:\n    restart: sometimes\n", "key 'serve.container.restart' must be"),
        ("serve:\n  model: m\n  container:\n    gpus: 0,1\n", "key 'serve.container.gpus' must be all"),
        ("serve:\n  model: m\n  container:\n    shm_size: lots\n", "key 'serve.container.shm_size' must be a size"),
        ("serve:\n  model: m\n  container:\n    volumes: [/srv]\n", "key 'serve.container.volumes[0]' must be"),
        ("serve:\n  model: m\n  container:\n    name: -x\n", "key 'serve.container.name' is not a valid"),
        ("serve:\n  model: m\n  container:\n    cpus: 2\n", "key 'serve.container.cpus' is not a known key"),
    ],
)
def test_bad_serve_sections_name_file_and_key(tmp_path: Path, serve: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, serve)
    assert "images/tiny.yaml" in info.value.message and message in info.value.message
    assert info.value.hint and "images/tiny.yaml" in info.value.hint


def test_no_serve_section_is_an_error_with_a_hint(tmp_path: Path) -> None:
    (tmp_path / "vpatch.yaml").write_text("pin:\n  ref: v1.0\n")
    load(tmp_path, "")
    result = CliRunner().invoke(app, ["-C", str(tmp_path), "serve", "tiny", "--print"])
    assert result.exit_code == 1
    assert "images/tiny.yaml has no serve: section" in result.output and "hint:" in result.output


def test_the_health_check_is_the_liveness_script_on_one_line_and_runs(tmp_path: Path) -> None:
    """The rendered --health-cmd carries serve/alive.py itself (compressed, one line) and runs as docker runs it:
    through a shell, with python3; against a port nothing listens on it says "down" and exits 1."""
    import shlex
    import socket
    import subprocess
    import sys

    from vpatch.serve import alive
    from vpatch.serve.render import health_command, health_source

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    command = health_command(port)
    assert "\n" not in command and health_source(command) == Path(alive.__file__).read_text(encoding="utf-8")
    words = shlex.split(command)
    ran = subprocess.run([sys.executable, *words[1:], "--state", str(tmp_path / "state.json")],
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 1 and ran.stdout.startswith("down: "), (ran.returncode, ran.stdout, ran.stderr)
    assert health_source("curl -f http://127.0.0.1:8000/health") is None

