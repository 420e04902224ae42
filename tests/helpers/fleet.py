"""Two hosts for the fleet tests, both real docker daemons on this machine: production is the tests' usual daemon
(reached through a docker context, as an operator names a machine), the standby a second dockerd in its own
network namespace, data root and exec root, reached over ssh through a real sshd on 127.0.0.1 with a key made for
it (scripts/start-fleet-daemon starts both, installing openssh when missing). Each runs the real vLLM CPU test
server: the second daemon gets the server image by `docker save | docker load` once per machine (its data root
keeps it; measured: 33 s for the 2.6 GB image on the 2-core machine, 2026-12-07).

`fleet_project()` writes a project whose images/tiny.yaml has those two hosts, the standby with its own serve
overrides (a smaller KV budget, as the standby's one GPU has); `Fleet.ensure()` puts the yaml back and starts
what a test broke. The two servers are started once per session (fixture `tiny_fleet`, conftest.py), so the
fleet tests cost two server starts in all, plus what a test starts on purpose.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.serverimage import KV_BYTES, ROOT, free_port, tiny_serve, unique_name
from vpatch.docker import Docker

SCRIPT = ROOT / "scripts" / "start-fleet-daemon"
PRODUCTION_CONTEXT = "vpatch-fleet-production"
NAME = "tiny"
# The standby's own serve: a KV budget half production's (its single card), still two 1,024-token requests.
STANDBY_KV = KV_BYTES


@dataclass(frozen=True)
class FleetDaemon:
    """The second daemon: its socket (for the tests' own look), its ssh endpoint and where its servers listen."""

    socket: str
    ssh: str  # ssh://root@vpatch-fleet:PORT
    address: str  # the network namespace's address

    def docker(self) -> Docker:
        return Docker.connect(f"unix://{self.socket}")


def start_fleet_daemon(image: str) -> FleetDaemon:
    """The second daemon up and holding `image` (moved there from the first if it lacks it)."""
    done = subprocess.run([str(SCRIPT)], stdout=subprocess.PIPE, text=True, check=True)
    found = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    daemon = FleetDaemon(found["FLEET_SOCKET"], found["FLEET_SSH"], found["FLEET_ADDRESS"])
    second = daemon.docker()
    wanted = Docker.connect().image(image).id
    if not second.has_image(image) or second.image(image).id != wanted:
        began = time.monotonic()
        save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
        subprocess.run(["docker", "--host", f"unix://{daemon.socket}", "load"], stdin=save.stdout,
                       stdout=subprocess.DEVNULL, check=True)
        assert save.wait() == 0
        print(f"fleet: moved {image} to the second daemon in {time.monotonic() - began:.0f}s", file=sys.stderr)
    return daemon


def fleet_yaml(image: str, port: int, container: str, daemon: FleetDaemon, *, standby_docker: str | None = None,
               standby_serve: dict[str, Any] | None = None, production_serve: dict[str, Any] | None = None,
               deploy: dict[str, Any] | None = None) -> str:
    """images/tiny.yaml with two hosts: production on the first daemon (a docker context), the standby over ssh."""
    repository, tag = image.rsplit(":", 1)
    hosts: list[dict[str, Any]] = [
        {"name": "production", "docker": PRODUCTION_CONTEXT, "role": "production",
         **({"serve": production_serve} if production_serve else {})},
        {"name": "standby", "docker": standby_docker or daemon.ssh, "role": "standby", "address": daemon.address,
         "serve": standby_serve if standby_serve is not None else {"kv_cache_memory_bytes": STANDBY_KV,
                                                                   "max_num_seqs": 1}},
    ]
    return yaml.safe_dump({"image": {"repository": repository, "tag": tag}, "serve": tiny_serve(port, container),
                           **({"deploy": deploy} if deploy else {}), "hosts": hosts}, sort_keys=False)


@dataclass
class Fleet:
    """The project, its two hosts and the daemons behind them."""

    root: Path
    image: str
    port: int
    container: str
    daemon: FleetDaemon
    docker_config: Path  # DOCKER_CONFIG holding the production context
    state: Path  # VPATCH_STATE of its commands (journals, locks), its own as deployhost's hosts have
    starts: int = 0  # servers started by the fixture (the session's two, and repairs)

    @property
    def yaml_path(self) -> Path:
        return self.root / "images" / f"{NAME}.yaml"

    def write(self, **kwargs: Any) -> None:
        self.yaml_path.write_text(fleet_yaml(self.image, self.port, self.container, self.daemon, **kwargs))

    def production(self) -> Docker:
        return Docker.connect()

    def standby(self) -> Docker:
        return self.daemon.docker()

    @property
    def env(self) -> dict[str, str]:
        """Its commands' environment: the production context's DOCKER_CONFIG, its own state folder."""
        return dict(os.environ, DOCKER_CONFIG=str(self.docker_config), VPATCH_STATE=str(self.state))

    def cli(self, *args: str, cwd: Path | None = None) -> tuple[int, str, str]:
        """`vpatch --project ROOT ARGS` in a child process (the docker context needs DOCKER_CONFIG, ssh a clean
        environment): exit code, stdout, stderr."""
        done = subprocess.run([sys.executable, "-m", "vpatch", "--project", str(self.root), *args], env=self.env,
                              capture_output=True, text=True, timeout=900, cwd=cwd)
        return done.returncode, done.stdout, done.stderr

    def shell(self, command: str, *, env: dict[str, str]) -> tuple[int, str, str]:
        """A command line of a page (docs/fleet.md) run by bash in the project folder."""
        done = subprocess.run(["bash", "-c", command], env={**self.env, **env}, cwd=self.root, capture_output=True,
                              text=True, timeout=300)
        return done.returncode, done.stdout, done.stderr

    def ensure(self) -> None:
        """The default yaml, and both servers running what it says (started again only where a test broke one)."""
        self.write()
        code, out, err = self.cli("serve", NAME, "--diff")
        if code == 0:
            return
        said = out + err
        for host, docker in (("standby", self.standby()), ("production", self.production())):
            info = docker.container(self.container)
            code, _, _ = self.cli("serve", NAME, "--diff", "--host", host)
            if code == 0:
                continue
            if info is not None:
                docker.remove_container(info.id)
            code, out, err = self.cli("serve", NAME, "--host", host)
            assert code == 0, f"{said}\n{out}{err}"
            self.starts += 1


@contextmanager
def fleet_host(tmp_path_factory: pytest.TempPathFactory, image: str) -> Iterator[Fleet]:
    """The session's fleet: the project, the production context, and both servers started by `vpatch serve`."""
    daemon = start_fleet_daemon(image)
    root = tmp_path_factory.mktemp("fleet")
    (root / "images").mkdir()
    (root / "vpatch.yaml").write_text("pin:\n  ref: v0.32.0\n")
    config = root / "docker-config"
    config.mkdir()
    env = dict(os.environ, DOCKER_CONFIG=str(config))
    # The production host by a context's name, as `docker context create` names a remote machine.
    subprocess.run(["docker", "context", "create", PRODUCTION_CONTEXT, "--docker",
                    f"host={os.environ.get('DOCKER_HOST', 'unix:///var/run/docker.sock')}"],
                   env=env, check=True, capture_output=True)
    fleet = Fleet(root, image, free_port(), unique_name("vllm-fleet"), daemon, config,
                  tmp_path_factory.mktemp("fleet-state"))
    fleet.write()
    try:
        code, out, err = fleet.cli("serve", NAME)  # both hosts, the standby first
        assert code == 0, out + err
        fleet.starts += 2
        yield fleet
    finally:
        for docker in (fleet.production(), fleet.standby()):
            for found in docker.client.api.containers(all=True, filters={"name": fleet.container}):
                docker.remove_container(found["Id"])
