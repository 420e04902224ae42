"""Test base images with the official vllm/vllm-openai layout, made from Debian packages and a vLLM tree.

No registry is reachable from tests, so the official image is imitated: Debian's python3.11 and a
static busybox in a root filesystem, vLLM's Python package under
/usr/local/lib/python3.12/dist-packages/vllm (found through a .pth file, as the official image's
python3.12 finds it through its site-packages), imported with `docker import`. The package comes from
the release history's tree, so it is byte for byte what the pin says. Images are cached on the
daemon by a tag that names their inputs, so only the first run pays for them (a few seconds).
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vpatch import git as vgit
from vpatch.base.paths import cache_dir
from vpatch.docker import Docker

PACKAGE_DIR = "/usr/local/lib/python3.12/dist-packages/vllm"

# Enough for `python3 -c ...` with the stdlib, and a shell for the overlay's RUN step.
DEBS = (
    "busybox-static",
    "libc6",
    "libgcc-s1",
    "zlib1g",
    "libexpat1",
    "libffi8",
    "libbz2-1.0",
    "liblzma5",
    "libssl3",
    "python3.11-minimal",
    "libpython3.11-minimal",
    "libpython3.11-stdlib",
)

# Read at import, before hermetic_git points VPATCH_CACHE at a temporary home.
CACHE = cache_dir() / "testbase"


def debs() -> list[Path]:
    """The Debian packages of the rootfs, downloaded once into the cache."""
    target = CACHE / "debs"
    target.mkdir(parents=True, exist_ok=True)
    have = {p.name.split("_", 1)[0]: p for p in target.glob("*.deb")}
    missing = [name for name in DEBS if name not in have]
    if missing:
        download = ["apt-get", "download", "-q", *missing]
        if subprocess.run(download, cwd=target, capture_output=True).returncode != 0:
            # A machine whose package lists were never fetched (or are stale) knows no such versions yet.
            subprocess.run(["apt-get", "update", "-qq"], check=True, capture_output=True)
            subprocess.run(download, cwd=target, check=True, capture_output=True)
        have = {p.name.split("_", 1)[0]: p for p in target.glob("*.deb")}
    return [have[name] for name in DEBS]


def ensure_base(
    docker: Docker,
    version: str,
    *,
    package_tar: Callable[[], bytes],
    fingerprint: str,
    repo: str = "vpatch-test/vllm-openai",
) -> str:
    """A base image for vLLM `version` on the daemon, built unless cached; returns its tag.

    `package_tar` gives a tar whose members are vllm/...; `fingerprint` names its content (a git tree id)."""
    h = hashlib.sha256(f"{version}\0{fingerprint}\0".encode())
    for deb in debs():
        h.update(deb.name.encode())
    h.update(Path(__file__).read_bytes())
    tag = f"{repo}:v{version}-{h.hexdigest()[:12]}"
    if docker.has_image(tag):
        return tag
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        _rootfs(root, package_tar())
        data = io.BytesIO()
        with tarfile.open(fileobj=data, mode="w") as tar:
            tar.add(root, arcname=".", filter=_root_owned)
        data.seek(0)
        docker.import_rootfs(
            data,
            tag,
            changes=[
                "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                'ENTRYPOINT ["vllm", "serve"]',
                # The official image carries labels of its own that vpatch must override.
                f"LABEL org.opencontainers.image.version={version}",
                "LABEL org.opencontainers.image.source=https://example.invalid/base",
            ],
        )
    return tag


def _rootfs(root: Path, package_tar: bytes) -> None:
    root.mkdir()
    for deb in debs():
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    bin_dir = root / "bin"
    bin_dir.mkdir(exist_ok=True)
    applets = subprocess.run([str(root / "bin" / "busybox"), "--list"], capture_output=True, text=True, check=True)
    for applet in applets.stdout.split():
        link = bin_dir / applet
        if not link.exists() and not link.is_symlink():
            link.symlink_to("busybox")
    (root / "usr" / "bin" / "python3").symlink_to("python3.11")
    for d in ("tmp", "etc", "proc", "sys", "dev", "root"):
        (root / d).mkdir(exist_ok=True)
    (root / "tmp").chmod(0o1777)
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    target = root / PACKAGE_DIR.lstrip("/")
    target.parent.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(package_tar)) as tar:
        tar.extractall(target.parent, filter="data")
    # Bytecode next to every module, as a used image has: an overlay must not leave it stale.
    for module in list(target.rglob("*.py")):
        cache = module.parent / "__pycache__"
        cache.mkdir(exist_ok=True)
        (cache / f"{module.stem}.cpython-312.pyc").write_bytes(b"stale bytecode of " + module.name.encode())
    # The official image's python3.12 sees its dist-packages natively; our 3.11 is pointed at it.
    site = root / "usr" / "local" / "lib" / "python3.11" / "dist-packages"
    site.mkdir(parents=True)
    (site / "vllm-openai-layout.pth").write_text(str(Path(PACKAGE_DIR).parent) + "\n")


def _root_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


# --- the flash-next test series -------------------------------------------------------------

PIN = "v0.29.0"
SAMPLING_ADDITION = "\n\n# vpatch test: guard against negative top_k from the router.\nVPATCH_TOP_K_GUARD = True\n"
FLASH_MODULE = '"""Flash-attention selection for sm_120 (vpatch test module)."""\n\nSM120_BACKEND = "FLASH_ATTN"\n'
# Landing probes in the shipped series' format (patches/probes/): one declarative, one command.
PROBES = {
    "0001-top-k-guard.yaml": (
        "kind: files\nfiles:\n  vllm/sampling_params.py:\n    contains: [VPATCH_TOP_K_GUARD]\n"
    ),
    "0002-flash-sm120.yaml": 'kind: command\nrun: ["{python}", "{probe_dir}/0002-flash-sm120.py"]\ntimeout: 60\n',
    # Run with cwd = the folder holding vllm/ (a tree root, or the image's dist-packages).
    "0002-flash-sm120.py": (
        "import pathlib, sys\n"
        "sys.exit(0 if 'FLASH_ATTN' in pathlib.Path('vllm/vpatch_flash.py').read_text() else 1)\n"
    ),
}


@dataclass(frozen=True)
class SeriesFiles:
    patches: dict[str, bytes]  # name (NNNN-slug) -> format-patch file
    expected: dict[str, bytes | None]  # path -> content after the pin + the series (None: deleted)


def make_flash_series(history: Path, workdir: Path, *, flash_module: str = FLASH_MODULE) -> SeriesFiles:
    """Three real format-patch files against the pin of the release history: change a module, add one
    (with a probe), delete one."""
    scratch = workdir / "tree"
    env = dict(os.environ, GIT_AUTHOR_NAME="Test Person", GIT_AUTHOR_EMAIL="test@vpatch.invalid",
               GIT_COMMITTER_NAME="Test Person", GIT_COMMITTER_EMAIL="test@vpatch.invalid",
               GIT_AUTHOR_DATE="2026-09-01T12:00:00+00:00", GIT_COMMITTER_DATE="2026-09-01T12:00:00+00:00",
               GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull)

    def g(cwd: Path, *args: str) -> bytes:
        return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True).stdout

    vgit.add_worktree(history, scratch, PIN)  # through the git door: under its lock, no prune of another process takes it
    try:
        sampling = (scratch / "vllm/sampling_params.py").read_text() + SAMPLING_ADDITION
        steps = [
            ("0001-top-k-guard", "Guard top_k", {"vllm/sampling_params.py": sampling},
             "Probe: probes/0001-top-k-guard.yaml\n"),
            ("0002-flash-sm120", "Pick flash attention on sm_120", {"vllm/vpatch_flash.py": flash_module},
             "Probe: probes/0002-flash-sm120.yaml\n"),
            ("0003-drop-scripts-shim", "Drop the vllm.scripts shim", {"vllm/scripts.py": None}, ""),
        ]
        patches: dict[str, bytes] = {}
        for name, subject, files, trailers in steps:
            for path, content in files.items():
                if content is None:
                    (scratch / path).unlink()
                else:
                    (scratch / path).write_text(content)
            g(scratch, "add", "-A")
            g(scratch, "commit", "-q", "-m", f"{subject}\n\nWhy: the GPU host needs it.\n\nOrigin: vendor\n{trailers}")
            patches[name] = g(scratch, "-c", "core.abbrev=40", "format-patch", "-1", "--stdout", "--zero-commit",
                              "--full-index", "--no-signature", "--no-stat", "-k", "--no-renames", "--binary", "HEAD")
        expected = {
            "vllm/sampling_params.py": sampling.encode(),
            "vllm/vpatch_flash.py": flash_module.encode(),
            "vllm/scripts.py": None,
        }
        return SeriesFiles(patches, expected)
    finally:
        vgit.remove_worktree(history, scratch)


def write_project(root: Path, series: SeriesFiles, repo_root: Path) -> Path:
    """A project pinned at PIN of the release history with `series`, the repo's own images/flash-next.yaml
    (with the question file its deploy: section names) and overlay Dockerfile."""
    (root / "patches").mkdir(parents=True, exist_ok=True)
    (root / "images").mkdir(exist_ok=True)
    (root / "vpatch.yaml").write_text(f"upstream:\n  source: releases\n  releases: vllm\npin:\n  ref: {PIN}\npatches: patches\n")
    for old in (root / "patches").glob("*.patch"):
        old.unlink()
    for name, raw in series.patches.items():
        (root / "patches" / f"{name}.patch").write_bytes(raw)
    (root / "patches" / "probes").mkdir(exist_ok=True)
    for name, text in PROBES.items():
        (root / "patches" / "probes" / name).write_text(text)
    shutil.copyfile(repo_root / "images" / "flash-next.yaml", root / "images" / "flash-next.yaml")
    shutil.copyfile(repo_root / "Dockerfile", root / "Dockerfile")
    # flash-next.yaml's deploy: section names its question file; a project carries it beside images/.
    shutil.copytree(repo_root / "checks", root / "checks", dirs_exist_ok=True)
    return root
