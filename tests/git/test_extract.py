"""Tree extraction (`git.extract_tree`, as a probe workspace does it) killed half-way leaves nothing behind, and a
full disk says so.

A generated repository of 8,000 files (about 50 MB checked out, a few seconds of `git checkout-index` here) stands
in for the vLLM tree: big enough to kill the extraction while git writes, with no dependency on the release history.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from vpatch import git as vgit
from vpatch.base import GitError
from vpatch.probes.workspace import Session

FILES = 8000

# A vpatch process that extracts one tree into its probe workspace (the path a probe run takes), then lingers.
_EXTRACT = """
import sys, time
from pathlib import Path
from vpatch.probes.workspace import Session

with Session(cache=Path(sys.argv[1]), zygote=False) as session:
    session.tree(Path(sys.argv[2]), sys.argv[3])
    print("EXTRACTED", flush=True)
    time.sleep(60)
"""


def _make_repo(path: Path, files: int, size: int) -> str:
    """A repository with `files` incompressible files of about `size` bytes; returns its tree id."""
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    stream = [b"commit refs/heads/main\ncommitter t <t@example.com> 0 +0000\ndata 1\nx\n"]
    for i in range(files):
        data = os.urandom(size // 2).hex().encode()
        stream.append(f"M 100644 inline pkg{i % 100}/mod{i}.py\ndata {len(data)}\n".encode() + data + b"\n")
    subprocess.run(["git", "fast-import", "--quiet"], cwd=path, input=b"".join(stream), check=True)
    return subprocess.run(["git", "rev-parse", "main^{tree}"], cwd=path, check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture(scope="module")
def big_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    repo = tmp_path_factory.mktemp("big") / "repo"
    return repo, _make_repo(repo, FILES, 6000)


def _git_writing_into(folder: Path) -> list[str]:
    """The command lines of live processes that name `folder` (a git still extracting into it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        line = " ".join(a.decode("utf-8", "replace") for a in argv)
        if str(folder) in line and "checkout-index" in line:
            found.append(f"{entry.name}: {line}")
    return found


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_killed_extraction_leaves_nothing(big_repo: tuple[Path, str], tmp_path: Path, sig: signal.Signals) -> None:
    repo, tree = big_repo
    cache, tmpdir = tmp_path / "cache", tmp_path / "tmp"
    tmpdir.mkdir()
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    proc = subprocess.Popen([sys.executable, "-c", _EXTRACT, str(cache), str(repo), tree], env=env,
                            stdout=subprocess.PIPE, text=True)
    runs = cache / "probe-runs"
    deadline = time.monotonic() + 60
    try:
        # Kill it once git has begun writing the tree's files, well before it is done.
        while not any(runs.glob(f"run-*/{tree}/tree/pkg*")):
            assert proc.poll() is None, "the extraction ended before it could be killed"
            assert time.monotonic() < deadline, "the extraction never started writing"
            time.sleep(0.01)
        proc.send_signal(sig)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        said = proc.stdout.read()
    assert "EXTRACTED" not in said, "killed after the extraction, not during it"
    assert not any(runs.glob(f"run-*/{tree}/.extracted")), "the extraction had finished: not killed half-way"

    time.sleep(1.0)  # the kernel's SIGKILL to git is immediate; a second is slack for a loaded machine
    assert _git_writing_into(cache) == [], "git went on extracting after vpatch was killed"
    assert sorted(p.name for p in tmpdir.iterdir()) == [], "a temporary index was left in TMPDIR"

    # The next command removes what the killed one left (its run folder, the half tree and its index in it) ...
    with Session(cache=cache, zygote=False):
        pass
    assert list(runs.iterdir()) == []
    # ... and nothing writes there afterwards (an orphaned git would bring files back under the removed folder).
    time.sleep(1.0)
    assert _size(runs) == 0 and list(runs.iterdir()) == []
    assert sorted(p.name for p in tmpdir.iterdir()) == []


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs: a real full disk (needs root to mount; skipped where it cannot be mounted)."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_full_disk_says_no_space_left(tmp_path: Path, tiny_fs: Path) -> None:
    repo = tmp_path / "repo"
    tree = _make_repo(repo, 40, 100_000)  # 4 MB of files for 1 MiB of room
    with pytest.raises(GitError) as raised:
        vgit.extract_tree(repo, tree, tiny_fs / "work" / "tree")
    error = raised.value
    assert error.message.startswith(f"no space left on the filesystem of {tiny_fs} ("), error.message
    assert "unable to write" in error.message or "No space left" in error.message, error.message  # git's own line
    assert error.hint is not None and str(tiny_fs) in error.hint and "VPATCH_CACHE" in error.hint


def test_other_failures_are_not_called_a_full_disk(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _make_repo(repo, 2, 100)
    with pytest.raises(GitError) as raised:
        vgit.extract_tree(repo, "0" * 40, tmp_path / "out" / "tree")
    assert "no space left" not in raised.value.message
    assert raised.value.message.startswith("git read-tree")
