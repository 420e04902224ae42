"""Hermetic git for every test, and small real upstream repositories and projects to work on."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

FIXED_DATE = "2026-09-01T12:00:00+00:00"


# A test that uses one of these fixtures needs what the marker names, so it carries the marker: selection
# by marker (-m "not releases and not docker and not network") then leaves out exactly what cannot run here.
FIXTURE_MARKERS = {
    "release_history": ("releases",),
    "docker": ("docker",),
    "pip_index": ("network",),
    "vllm_server_image": ("vllm_server", "docker"),
    "tiny_production_server": ("vllm_server", "docker"),
    "tiny_bare_server": ("vllm_server", "docker"),
    "tiny_fleet_servers": ("vllm_server", "docker"),
}
# Every test of a real vLLM server runs on one xdist worker (--dist loadgroup), the rest beside it on the other:
# the shared production server (tiny_production, a session fixture: once per worker) then starts once per run,
# and two servers never load at once on two cores (timings the tests wait on stay those of one server).
FIXTURE_GROUPS = {
    "vllm_server_image": "vllm-server",
}


def pytest_configure(config: pytest.Config) -> None:
    from helpers import ciprofile

    ciprofile.register(config)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for fixture in getattr(item, "fixturenames", ()):
            for marker in FIXTURE_MARKERS.get(fixture, ()):
                if item.get_closest_marker(marker) is None:
                    item.add_marker(marker)
            if fixture in FIXTURE_GROUPS and item.get_closest_marker("xdist_group") is None:
                item.add_marker(pytest.mark.xdist_group(FIXTURE_GROUPS[fixture]))


@pytest.fixture(autouse=True)
def hermetic_git(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No user or system git config, a fixed identity and dates, a private vpatch cache."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(home / ".gitconfig"))
    for var in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{var}_NAME", "Test Person")
        monkeypatch.setenv(f"GIT_{var}_EMAIL", "test@vpatch.invalid")
        monkeypatch.setenv(f"GIT_{var}_DATE", FIXED_DATE)
    monkeypatch.setenv("VPATCH_CACHE", str(home / "vpatch-cache"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("GIT_DIR", raising=False)
    monkeypatch.delenv("GIT_INDEX_FILE", raising=False)
    # xdist's workers get COLUMNS=80 from their controller: the commands' tables would wrap there and nowhere else.
    monkeypatch.delenv("COLUMNS", raising=False)
    return home


def git(cwd: Path, *args: str, input: bytes | None = None) -> str:
    return subprocess.run(["git", *args], cwd=cwd, input=input, check=True, capture_output=True).stdout.decode()


def patch_of_head(repo: Path) -> str:
    """The HEAD commit of `repo` as vpatch exports a patch: format-patch with full ids, no signature or stat."""
    return git(repo, "-c", "core.abbrev=40", "format-patch", "-1", "--stdout", "--zero-commit", "--full-index",
               "--no-signature", "--no-stat", "-k", "--no-renames", "--binary", "HEAD")


@dataclass
class ToyUpstream:
    """A non-bare upstream repository that tests commit to; the project mirrors it by file URL."""

    path: Path

    @property
    def url(self) -> str:
        return self.path.as_uri()

    def commit(self, files: dict[str, str | None], message: str, *, tag: str | None = None) -> str:
        for name, content in files.items():
            target = self.path / name
            if content is None:
                target.unlink()
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
        git(self.path, "add", "-A")
        git(self.path, "commit", "-q", "--allow-empty", "-m", message)
        if tag:
            git(self.path, "tag", tag)
        return git(self.path, "rev-parse", "HEAD").strip()

    def grow(self, commits: Iterable[tuple[str, dict[str, str]]]) -> list[str]:
        """Append many commits (subject, files to write) to main in one fast-import: a long history in seconds."""
        parent = git(self.path, "rev-parse", "HEAD").strip()
        stream = bytearray()
        count = 0
        for count, (subject, files) in enumerate(commits, start=1):
            message = subject.encode() + b"\n"
            stream += f"commit refs/heads/main\nmark :{count}\n".encode()
            stream += f"committer Test Person <test@vpatch.invalid> {1788264000 + 60 * count} +0000\n".encode()
            stream += f"data {len(message)}\n".encode() + message
            if count == 1:
                stream += f"from {parent}\n".encode()
            for name, content in files.items():
                data = content.encode()
                stream += f"M 100644 inline {name}\ndata {len(data)}\n".encode() + data + b"\n"
        stream += b"done\n"
        marks = self.path.parent / f"{self.path.name}-marks"
        git(self.path, "fast-import", "--quiet", "--done", f"--export-marks={marks}", input=bytes(stream))
        shas = dict(line.split() for line in marks.read_text().splitlines())
        marks.unlink()
        git(self.path, "reset", "--hard", "-q", "main")
        return [shas[f":{i}"] for i in range(1, count + 1)]


PARSER_V1 = "".join(f"line {i}\n" for i in range(1, 41))
KV_V1 = "def free(blocks):\n    for b in reversed(blocks):\n        if b is None:\n            break\n        release(b)\n"
KV_FIXED = KV_V1.replace("break", "continue")  # the free loop skips null blocks instead of stopping
PARSER_FIXED = PARSER_V1.replace("line 20\n", "line 20 fixed\n")


@pytest.fixture
def toy_upstream(tmp_path: Path) -> ToyUpstream:
    """Upstream with v1.0 (two Python files and a README) on its main branch."""
    path = tmp_path / "upstream"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    up = ToyUpstream(path)
    up.commit({"README": "toy vllm\n", "vllm/parser.py": PARSER_V1, "vllm/kv.py": KV_V1}, "v1.0", tag="v1.0")
    return up


@pytest.fixture
def fixed(toy_upstream: ToyUpstream) -> str:
    """v1.1 of the toy upstream: the free loop skips null blocks instead of stopping."""
    return toy_upstream.commit({"vllm/kv.py": KV_FIXED}, "kv: skip null blocks", tag="v1.1")


@dataclass
class Project:
    root: Path
    upstream: ToyUpstream

    @property
    def patches(self) -> Path:
        return self.root / "patches"

    def make_patch(self, number: int, slug: str, files: dict[str, str | None], subject: str,
                   *, trailers: str = "Origin: vendor\nLast-Update: 2026-09-01", base: str = "v1.0") -> Path:
        """A format-patch file made from a real commit on a scratch clone of the upstream."""
        scratch = self.root.parent / f"scratch-{number}"
        if not scratch.exists():
            git(self.root.parent, "clone", "-q", str(self.upstream.path), str(scratch))
        git(scratch, "checkout", "-q", "--detach", base)
        for name, content in files.items():
            target = scratch / name
            if content is None:
                target.unlink()
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(content)
        git(scratch, "add", "-A")
        git(scratch, "commit", "-q", "-m", f"{subject}\n\nWhy this change exists.\n\n{trailers}\n")
        raw = patch_of_head(scratch)
        path = self.patches / f"{number:04d}-{slug}.patch"
        path.write_text(raw)
        return path


def vpatch_cli(project: Project | Path, *args: str) -> tuple[int, str]:
    """`vpatch --project <root> ARGS` in this process (typer's CliRunner): its exit code and output."""
    from typer.testing import CliRunner

    from vpatch.commands.cli import app

    root = project.root if isinstance(project, Project) else project
    result = CliRunner().invoke(app, ["--project", str(root), *args])
    return result.exit_code, result.output


def vpatch_streams(project: Project | Path, *args: str) -> tuple[int, str, str]:
    """`vpatch --project <root> ARGS` in this process: its exit code, stdout and stderr, kept apart."""
    from typer.testing import CliRunner

    from vpatch.commands.cli import app

    root = project.root if isinstance(project, Project) else project
    result = CliRunner().invoke(app, ["--project", str(root), *args])
    return result.exit_code, result.stdout, result.stderr


def vpatch_json(project: Project | Path, *args: str) -> tuple[int, Any]:
    """`vpatch ... --json`: its exit code and the document on stdout, which must hold nothing else
    (progress lines go to stderr, however long a step takes)."""
    code, out, err = vpatch_streams(project, *args)
    try:
        return code, json.loads(out)
    except json.JSONDecodeError as e:
        raise AssertionError(f"stdout is not one JSON document ({e}):\n{out}\n-- stderr:\n{err}") from None


def write_config(root: Path, url: str, ref: str = "v1.0") -> None:
    (root / "vpatch.yaml").write_text(f"upstream:\n  source: git\n  git: {url}\npin:\n  ref: {ref}\npatches: patches\n")


@pytest.fixture
def project(tmp_path: Path, toy_upstream: ToyUpstream) -> Project:
    """A project pinned at v1.0 of the toy upstream, with its mirror fetched and an empty series."""
    from vpatch.base.paths import cache_dir
    from vpatch.upstream import mirror

    root = tmp_path / "project"
    (root / "patches").mkdir(parents=True)
    write_config(root, toy_upstream.url)
    mirror.fetch(cache_dir(), toy_upstream.url)
    return Project(root, toy_upstream)


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under root (except .vpatch state) with its bytes, to prove nothing changed."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".vpatch" not in p.relative_to(root).parts
    }


# --- the real vLLM release history ------------------------------------------------------

# The user's cache, read at import: hermetic_git later points VPATCH_CACHE at a temporary home.
from vpatch.base.paths import cache_dir as _cache_dir  # noqa: E402

REAL_CACHE = _cache_dir()
_PIP_CACHE = os.environ.get("PIP_CACHE_DIR") or str(Path.home() / ".cache" / "pip")
RELEASE_VERSIONS = ["0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0"]


@pytest.fixture
def pip_index() -> dict[str, str]:
    """The environment for a pip that installs from the package index (the network), reusing the user's
    pip cache (read before hermetic_git moved HOME)."""
    return {**os.environ, "PIP_CACHE_DIR": _PIP_CACHE}


@pytest.fixture(scope="session")
def release_history() -> Path:
    """The real v0.28.0 ... v0.33.0 history repository, built in the user's cache the first time."""
    from vpatch.upstream import releases

    return releases.ensure_history(RELEASE_VERSIONS, cache=REAL_CACHE)


# --- the real vLLM CPU server image (serve, deploy) ----------------------------------------


@pytest.fixture(scope="session")
def vllm_server_image() -> str:
    """Tag of the real vLLM 0.32.0 CPU server image, built once per machine (see tests/helpers/serverimage.py)."""
    from helpers.serverimage import ensure_server_image

    return ensure_server_image()


@pytest.fixture(scope="session")
def tiny_production_server(tmp_path_factory: pytest.TempPathFactory, vllm_server_image: str) -> Iterator[Any]:
    """The serve and deploy tests' production server, started once per session (worker) by `vpatch serve`."""
    from helpers.deployhost import production_host

    with production_host(tmp_path_factory, vllm_server_image) as host:
        yield host


@pytest.fixture
def tiny_production(tiny_production_server: Any) -> Any:
    """The shared production host (tests/helpers/deployhost.py `Host`), checked before the test and repaired if an
    earlier test broke it. Use it for any test that needs a running vLLM server of the tiny model."""
    tiny_production_server.ensure()
    return tiny_production_server


@pytest.fixture(scope="session")
def tiny_bare_server(tmp_path_factory: pytest.TempPathFactory, vllm_server_image: str) -> Iterator[Any]:
    """The same project on another container name, port and state folder, where nothing runs (it starts nothing)."""
    from helpers.deployhost import production_host

    with production_host(tmp_path_factory, vllm_server_image, bare=True) as host:
        yield host


@pytest.fixture(scope="session")
def tiny_fleet_servers(tmp_path_factory: pytest.TempPathFactory, vllm_server_image: str) -> Iterator[Any]:
    """Two hosts, production on this daemon and a standby on a second one reached over ssh, each running the tiny
    server, started once per session (tests/helpers/fleet.py)."""
    from helpers.fleet import fleet_host

    with fleet_host(tmp_path_factory, vllm_server_image) as fleet:
        yield fleet


@pytest.fixture
def tiny_fleet(tiny_fleet_servers: Any) -> Any:
    """The shared two-host fleet (tests/helpers/fleet.py `Fleet`), its yaml put back and what a test broke started
    again before the test."""
    tiny_fleet_servers.ensure()
    return tiny_fleet_servers


@pytest.fixture
def tiny_bare(tiny_bare_server: Any) -> Any:
    """A host with no production (tests/helpers/deployhost.py `Host`, bare): a failing deploy there costs one server
    start, its candidate's, instead of two. Use it where the check that fails is the subject, not the rollback."""
    tiny_bare_server.ensure()
    return tiny_bare_server
