"""`hosts:` in images/<name>.yaml: the machines one image runs on. Config-only rules, refused before any daemon
is reached (tests/serve/test_serve_fleet.py shows them against two real docker daemons)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vpatch.base.errors import ConfigError
from vpatch.config import EndpointKind, HostRole
from vpatch.config.definition import ImageDefinition
from vpatch.serve import places

HEAD = "image:\n  repository: test/vllm\n  tag: tiny\n"
SERVE = ("serve:\n  model: /models/tiny\n  max_model_len: 1024\n  tensor_parallel_size: 4\n"
         "  container:\n    name: vllm-tiny\n    gpus: all\n")
TWO = """hosts:
  - name: gpu-1
    docker: ssh://ops@gpu-1.lan:2222
    role: production
  - name: gpu-2
    docker: standby-ctx
    role: standby
    address: 10.0.0.2
    serve:
      tensor_parallel_size: 1
      kv_cache_memory_bytes: 8000000000
      container:
        gpus: "1"
"""


def load(root: Path, body: str) -> ImageDefinition:
    (root / "images").mkdir(exist_ok=True)
    (root / "images" / "tiny.yaml").write_text(HEAD + body)
    return ImageDefinition.load(root, "tiny").validate()


def refused(root: Path, body: str) -> str:
    with pytest.raises(ConfigError) as info:
        load(root, body)
    assert "images/tiny.yaml" in info.value.message and info.value.hint, info.value.message
    return info.value.message


def test_each_host_runs_the_serve_section_with_its_own_overrides(tmp_path: Path) -> None:
    definition = load(tmp_path, SERVE + TWO)
    production, standby = definition.hosts
    assert (production.role, standby.role) == (HostRole.PRODUCTION, HostRole.STANDBY)
    assert production.endpoint.kind is EndpointKind.SSH and production.reach == "gpu-1.lan"
    assert standby.endpoint.kind is EndpointKind.CONTEXT and standby.reach == "10.0.0.2"
    on_standby = definition.on_host(standby).serve
    assert on_standby is not None and definition.serve is not None
    # The overrides replace their keys, container key by key; the rest is the serve section's.
    assert (on_standby.tensor_parallel_size, on_standby.kv_cache_memory_bytes) == (1, 8000000000)
    assert (on_standby.container.gpus, on_standby.container.name) == ("1", "vllm-tiny")
    assert on_standby.max_model_len == definition.serve.max_model_len == 1024
    assert definition.on_host(production).serve == definition.serve
    # The standby first (the deploy order), and each host's docker run reaches its own daemon.
    fleet = places(definition)
    assert [p.name for p in fleet] == ["gpu-2", "gpu-1"]
    assert fleet[0].serve_command().argv[:4] == ("docker", "--context", "standby-ctx", "run")
    assert fleet[1].serve_command().argv[:4] == ("docker", "--host", "ssh://ops@gpu-1.lan:2222", "run")
    assert "--tensor-parallel-size" in fleet[0].serve_command().args


def test_without_hosts_the_local_daemon_as_before(tmp_path: Path) -> None:
    definition = load(tmp_path, SERVE)
    assert definition.hosts == ()
    (only,) = places(definition)
    assert only.host is None and only.serve_command().argv[:2] == ("docker", "run")


def test_an_unknown_host_names_the_known_ones(tmp_path: Path) -> None:
    definition = load(tmp_path, SERVE + TWO)
    with pytest.raises(ConfigError, match=r"no host 'gpu-3' \(its hosts: gpu-1, gpu-2\)"):
        places(definition, "gpu-3")
    with pytest.raises(ConfigError, match="no hosts: list"):
        places(load(tmp_path, SERVE), "gpu-1")


@pytest.mark.parametrize(("body", "said"), [
    (TWO.replace("role: standby", "role: production"), "key 'hosts[1].role' is production, as hosts[0] (gpu-1) is"),
    (TWO.replace("name: gpu-2", "name: gpu-1"), "key 'hosts[1].name' is 'gpu-1', as hosts[0].name"),
    (TWO.replace("role: standby", "role: canary"), "must be production or standby, not 'canary'"),
    (TWO.replace("ssh://ops@gpu-1.lan:2222", "http://gpu-1:2375"), "begin ssh://, unix:// or tcp://, not http://"),
    (TWO.replace("ssh://ops@gpu-1.lan:2222", "ssh://ops@gpu-1:99999"), "its port is not a number"),
    (TWO.replace("ssh://ops@gpu-1.lan:2222", "ssh://ops@gpu-1/var"), "nothing after the host"),
    (TWO.replace("ssh://ops@gpu-1.lan:2222", "unix://docker.sock"), "its absolute path"),
    (TWO.replace("standby-ctx", "'my context'"), "nor a docker context's name"),
    (TWO.replace("role: production", "role: standby").replace("role: standby\n    address", "role: x\n    address"),
     "must be production or standby"),
    ("hosts: []\n", "must be a list of hosts"),
    ("hosts:\n  - name: a\n    docker: unix:///run/d.sock\n    role: standby\n", "has no host with role production"),
    (TWO.replace("    serve:\n      tensor_parallel_size: 1\n", "    serve:\n      tensor_parallel_size: 8\n"),
     "images/tiny.yaml (host gpu-2: serve: with hosts[1].serve): key 'serve.tensor_parallel_size'"),
    (TWO.replace("kv_cache_memory_bytes", "kv_cache_bytes"), "(host gpu-2: serve: with hosts[1].serve): key "
     "'serve.kv_cache_bytes' is not a known key"),
])
def test_a_bad_hosts_list_is_refused_with_the_key_and_the_host(tmp_path: Path, body: str, said: str) -> None:
    assert said in refused(tmp_path, SERVE + body)


def test_deploy_recovery_over_hosts_names_one_host(tmp_path: Path) -> None:
    """--rollback acts on one host's journal, so a definition with hosts wants --host; --prune and --report keep
    to this machine's state and take no --host. Refused before any daemon is reached."""
    from typer.testing import CliRunner

    from vpatch.commands.cli import app

    load(tmp_path, SERVE + TWO)
    (tmp_path / "vpatch.yaml").write_text("pin:\n  ref: v1.0\n")
    result = CliRunner().invoke(app, ["-C", str(tmp_path), "deploy", "tiny", "--rollback"])
    assert result.exit_code == 1
    assert "images/tiny.yaml has hosts (gpu-2, gpu-1): --rollback acts on one host's deploy" in result.output
    assert "--rollback --host gpu-1" in result.output
    result = CliRunner().invoke(app, ["-C", str(tmp_path), "deploy", "tiny", "--prune", "--host", "gpu-1"])
    assert result.exit_code == 1 and "--host goes with a deploy, --status or --rollback, not --prune" in result.output
