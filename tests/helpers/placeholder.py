"""A stand-in server image for tests about containers, not about vLLM: one static binary as /usr/bin/vllm
behind the official entrypoint (`vllm serve`), so a `docker run` that vpatch renders really starts and runs.

It ignores its arguments and waits (SIGTERM ends it with code 0), except: an argument `--exit-now` makes it exit with code
3 at once (a crash loop under a restart policy), `--unhealthy` makes it exit 1 (a failing health check
command). Built with the system's C compiler (gcc -static); the tests using it skip where there is none.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest

from vpatch.docker import Docker

_SOURCE = r"""
#include <signal.h>
#include <string.h>
#include <unistd.h>
static void stop(int sig) { (void)sig; _exit(0); }
int main(int argc, char **argv) {
    signal(SIGTERM, stop);  /* as PID 1 it would otherwise ignore `docker stop` for its whole timeout */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--exit-now")) return 3;
        if (!strcmp(argv[i], "--unhealthy")) return 1;
    }
    for (;;) pause();
}
"""


def build(docker: Docker, changes: Sequence[str] = ()) -> str:
    """A fresh image holding the stand-in (tagged with a unique name); `changes` as for `docker import`."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc to build the stand-in server binary")
    with tempfile.TemporaryDirectory() as tmp:
        source, binary = Path(tmp) / "server.c", Path(tmp) / "vllm"
        source.write_text(_SOURCE)
        subprocess.run(["gcc", "-static", "-Os", "-o", str(binary), str(source)], check=True)
        rootfs = io.BytesIO()
        with tarfile.open(fileobj=rootfs, mode="w") as tar:
            tar.add(binary, "usr/bin/vllm")
        rootfs.seek(0)
        ref = f"vpatch-test/placeholder-server:{uuid.uuid4().hex[:8]}"
        docker.import_rootfs(rootfs, ref, ['ENTRYPOINT ["vllm", "serve"]', "ENV PATH=/usr/bin", *changes])
    return ref
