"""Fake vLLM sdists, byte-reproducible, and a downloader over them that can be told to fail."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

from vpatch.base.errors import UpstreamError
from vpatch.base.progress import Event, Reporter
from vpatch.upstream import releases

# Member mtimes of the fake sdists: release 1.N was packed on day N.
DAY = 86400
BASE_TIME = 1_780_000_000


def fake_sdist(version: str) -> bytes:
    """A byte-reproducible sdist shaped like vLLM's: top folder, PKG-INFO, egg-info, a script, a symlink."""
    minor = int(version.split(".")[1])
    top = f"vllm-{version}"
    mtime = BASE_TIME + minor * DAY
    files: list[tuple[str, bytes, int, str | None]] = [  # (path, content, mode, symlink target)
        ("PKG-INFO", f"Metadata-Version: 2.4\nName: vllm\nVersion: {version}\n".encode(), 0o644, None),
        ("vllm.egg-info/PKG-INFO", b"Name: vllm\n", 0o644, None),
        ("vllm.egg-info/SOURCES.txt", b"vllm/__init__.py\n", 0o644, None),
        ("setup.py", b"from setuptools import setup\nsetup()\n", 0o644, None),
        ("vllm/__init__.py", f"VERSION = {version!r}\n".encode(), 0o644, None),
        ("vllm/_version.py", f"__version__ = {version!r}\ncommit_id = 'g{minor:07x}abc'\n".encode(), 0o644, None),
        ("tools/run.sh", b"#!/bin/sh\necho run\n", 0o755, None),
        ("docs/latest.md", b"", 0o644, "../README.md"),
        ("README.md", f"vllm {version}\n".encode(), 0o664, None),
    ]
    raw = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            top_info = tarfile.TarInfo(top + "/")
            top_info.type, top_info.mode, top_info.mtime = tarfile.DIRTYPE, 0o755, mtime - 3600
            tar.addfile(top_info)
            for i, (path, content, mode, target) in enumerate(files):
                info = tarfile.TarInfo(f"{top}/{path}")
                info.mode, info.mtime = mode, mtime - 600 + i  # the newest member is the last one
                if target is not None:
                    info.type, info.linkname = tarfile.SYMTYPE, target
                    tar.addfile(info)
                else:
                    info.size = len(content)
                    tar.addfile(info, io.BytesIO(content))
    return raw.getvalue()


class FakePyPI:
    """A downloader over fake sdists; records what it was asked for and can be told to fail."""

    def __init__(self, *, fail: set[str] | None = None, corrupt: set[str] | None = None) -> None:
        self.asked: list[str] = []
        self.fail = fail or set()
        self.corrupt = corrupt or set()

    def __call__(self, version: str, dest: Path, report: Reporter) -> Path:
        self.asked.append(version)
        report(Event(f"vllm {version}", "downloading", done=0))
        out = dest / f"vllm-{version}.tar.gz"
        data = fake_sdist(version)
        if version in self.fail:
            out.write_bytes(data[: len(data) // 2])  # a partial file, then the network goes away
            raise UpstreamError(f"pip could not download the sdist of vllm {version}")
        out.write_bytes(data[: len(data) // 2] if version in self.corrupt else data)
        return out


def tag_table(cache: Path) -> dict[str, str]:
    return {r.tag: r.commit for r in releases.list_releases(cache)}
