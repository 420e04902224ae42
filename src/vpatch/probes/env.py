"""The probe venv: built once per requirement set from a lock file of exact pins, keyed by its content.

A lock file (``patches/probes/requirements.lock``) names every distribution the venv holds as
``name==version``, installed as listed with ``uv pip install --no-deps`` from where pip finds them: no resolver runs, so a
transitive package cannot move under a probe and flip its verdict. Its header says how to
refresh it (``# requires:`` what to resolve, ``# omit:`` what to leave out); ``refresh_lock`` does.
Venvs live in ``$VPATCH_CACHE/probe-venvs/<key>``, built in a ``.``-folder and renamed into place.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vpatch.base import Event, ProcessError, Reporter, VpatchError, atomic_write, cache_dir, exclusive, run_process, silent

LOCK_NAME = "requirements.lock"
_SUBJECT = "probe venv"
_HEADER = re.compile(r"#\s*(requires|omit):(.*)")
# Beside a venv whose installed files are byte-compiled (one built by an older vpatch with uv is not: it is compiled
# once, when next used)
BYTECODE_FILE = "vpatch-bytecode"


class EnvError(VpatchError):
    """The probe venv cannot be built, or its lock file is invalid."""


@dataclass(frozen=True)
class Requirements:
    """What a probe venv holds: exact pins from a lock file, or a plain list pip resolves."""

    lines: tuple[str, ...]
    locked: bool = False  # pins from a lock file: installed as listed, without dependencies
    source: bytes = b""  # the lock file's bytes (comments included): part of the key

    @classmethod
    def inline(cls, lines: Sequence[str]) -> Requirements:
        return cls(tuple(lines), False, "\n".join(lines).encode())

    @classmethod
    def from_lock(cls, path: Path) -> Requirements:
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise EnvError(f"{path}: cannot read the lock file: {exc}",
                           hint="a probe's lock: is relative to the probe's folder") from exc
        return cls(_pins(path, raw), True, raw)

    def key(self) -> str:
        """The venv's folder name: the requirement set, how it is installed, and the interpreter."""
        text = f"{sys.version_info.major}.{sys.version_info.minor}\n{'lock' if self.locked else 'list'}\n"
        return hashlib.sha256(text.encode() + self.source).hexdigest()[:20]


def _pins(path: Path, raw: bytes) -> tuple[str, ...]:
    from packaging.requirements import InvalidRequirement, Requirement  # lazy: its grammar costs status start-up ~15 ms

    pins = []
    for number, line in enumerate(raw.decode("utf-8", "replace").splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            req = Requirement(text)
        except InvalidRequirement as exc:
            raise EnvError(f"{path}:{number}: not a requirement: {text!r} ({exc})") from None
        specs = list(req.specifier)
        if len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version or req.marker or req.url:
            raise EnvError(f"{path}:{number}: {text!r} is not an exact pin",
                           hint="a lock file holds name==version lines only; `vpatch probes lock` writes it")
        pins.append(text)
    return tuple(pins)


def venv_root(cache: Path | None = None) -> Path:
    return (cache_dir() if cache is None else cache) / "probe-venvs"


def probe_venv(requirements: Requirements, *, cache: Path | None = None, report: Reporter = silent) -> Path:
    """The python of the venv for `requirements`, built once (in a temporary folder, then renamed)."""
    root = venv_root(cache)
    final = root / requirements.key()
    python = final / "bin" / "python"
    if python.exists() and ((final / BYTECODE_FILE).exists() or not os.access(final, os.W_OK)):
        return python  # compiled, or where this user may not compile it (a shared read-only cache)
    root.mkdir(parents=True, exist_ok=True)
    with exclusive(root / ".lock", what="probe venv build"):
        if python.exists():
            if not (final / BYTECODE_FILE).exists():  # built by an older vpatch, whose uv install compiled nothing
                _compile(final, report)
            return python  # built by the run that held the lock before us
        # Under the lock, a dot-folder is what a killed build left (pip's temporary files included).
        for leftover in root.glob(".*-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        started = time.monotonic()
        building = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
        try:
            _build(building, requirements, report)
            _replace(final, building)
        except BaseException:
            report(Event(_SUBJECT, "failed", final=True, seconds=time.monotonic() - started))
            raise
        finally:
            shutil.rmtree(building, ignore_errors=True)
    size = sum(p.stat().st_size for p in final.rglob("*") if p.is_file() and not p.is_symlink())
    report(Event(_SUBJECT, "ready", f"{final.name} ({size / 1e9:.2f} GB)", final=True,
                 seconds=time.monotonic() - started))
    return python


def _compile(venv: Path, report: Reporter) -> None:
    """Byte-compile what an older vpatch installed into `venv` without it, once (the marker says it is done)."""
    started = time.monotonic()
    report(Event(_SUBJECT, "byte-compiling", f"{venv.name} (built without bytecode; once)"))
    # exit status 1: some file did not compile (a package's Python 2 example); a run would fail on it the same way
    run_process([str(venv / "bin" / "python"), "-m", "compileall", "-q", "-j0",
                 *(str(p) for p in sorted(venv.glob("lib/python*/site-packages")))], check=False, merge_output=True)
    with contextlib.suppress(OSError):  # a folder that became read-only meanwhile: the next command tries again
        atomic_write(venv / BYTECODE_FILE, b"")
    report(Event(_SUBJECT, "byte-compiled", venv.name, final=True, seconds=time.monotonic() - started))


def _replace(final: Path, built: Path) -> None:
    """Put `built` at `final`; a broken venv there (no bin/python) is moved aside first, then deleted."""
    trash = None
    if final.exists():
        trash = Path(tempfile.mkdtemp(prefix=f".{final.name}-broken-", dir=final.parent))
        final.rename(trash / "venv")
    built.rename(final)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


def _build(dest: Path, requirements: Requirements, report: Reporter) -> None:
    # A venv can be renamed once built: vpatch runs `bin/python` (a link), never a script's shebang.
    report(Event(_SUBJECT, "creating the venv", dest.name.lstrip(".").rsplit("-", 1)[0]))
    args = [sys.executable, "-m", "venv", str(dest)]
    if not requirements.lines:
        args.insert(3, "--without-pip")
    _pip_step(args, "create the probe venv", dest)
    if not requirements.lines:
        atomic_write(dest / BYTECODE_FILE, b"")
        return
    python = str(dest / "bin" / "python")
    pip = [python, "-m", "pip", "--disable-pip-version-check", "install", "--quiet"]
    if requirements.locked:
        uv = _uv()
        report(Event(_SUBJECT, f"installing {len(requirements.lines)} pinned packages",
                     f"({'uv, ' if uv else ''}--no-deps, no resolver)"))
        install, env = ([*pip, "--no-deps"], {}) if uv is None else _uv_install(uv, python, sys.executable)
        try:
            _pip_step([*install, *requirements.lines], "install the locked probe requirements", dest, env)
        except EnvError as exc:
            raise _missing_cpu_build(exc, requirements.lines) or exc from None
    else:
        report(Event(_SUBJECT, "resolving the requirements"))
        _refuse_cuda_torch(resolve(requirements.lines, dest, python=python))
        report(Event(_SUBJECT, f"installing {len(requirements.lines)} requirements and their dependencies"))
        _pip_step([*pip, *requirements.lines], "install the probe requirements", dest)
    atomic_write(dest / BYTECODE_FILE, b"")  # pip compiles what it installs, uv as told (_uv_install)


def resolve(lines: Sequence[str], work: Path, *, python: str = sys.executable) -> list[tuple[str, str]]:
    """What pip would install for `lines` from scratch: (name, version) pairs, from its --report."""
    report_file = work / ".pip-report.json"
    _pip_step([python, "-m", "pip", "--disable-pip-version-check", "install", "--quiet", "--dry-run",
               "--ignore-installed", "--report", str(report_file), *lines], "resolve the probe requirements", work)
    install = json.loads(report_file.read_bytes()).get("install", [])
    report_file.unlink()
    return [(str(i["metadata"]["name"]), str(i["metadata"]["version"])) for i in install]


def _refuse_cuda_torch(resolved: Sequence[tuple[str, str]]) -> None:
    """Probes run on the CPU: never let pip pull a CUDA torch (gigabytes of nvidia-* wheels)."""
    for name, version in resolved:
        lowered = name.lower()
        if lowered.startswith("nvidia-") or (lowered == "torch" and not version.endswith("+cpu")):
            raise EnvError(
                f"the probe venv would install a CUDA build of torch ({name} {version})",
                hint="make a CPU torch wheel visible to pip, e.g. PIP_FIND_LINKS=<folder with torch-*+cpu*.whl>"
                     " or PIP_EXTRA_INDEX_URL=<PyTorch's CPU wheel index>",
            )


# pip's words for "no such distribution here" (the last: its resolver, when a constraint file names the package),
# then uv's (an index that has other versions; sources that have none at all).
_NOT_FOUND = ("No matching distribution found for {pin}", "satisfies the requirement {pin}", "Cannot install {pin}",
              "there is no version of {pin}", "{name} was not found in the")


def _missing_cpu_build(exc: EnvError, lines: Sequence[str]) -> EnvError | None:
    """The error for a locked CPU build of PyTorch (torch==X+cpu) that pip cannot see: PyPI carries only the CUDA
    builds, so a machine whose pip knows no other place fails here, in pip's words that blame dependencies."""
    for pin in lines:
        name = pin.split("==")[0]
        if "+cpu" in pin and any(form.format(pin=pin, name=name) in exc.message for form in _NOT_FOUND):
            return EnvError(
                f"no wheel of {pin} where pip looks, the CPU build of PyTorch the probe lock pins (PyPI does not carry it)",
                hint="let pip see it (vpatch's installer reads pip's sources): "
                     "PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu or PIP_FIND_LINKS=<folder with the wheel>")
    return None


def _uv() -> str | None:
    """uv's binary (the `uv` wheel, a declared dependency, carries it); None where it is missing: pip installs then."""
    try:
        import uv  # lazy: optional at run time (pip installs without it); only a venv build asks
    except ImportError:
        return None
    try:
        return str(uv.find_uv_bin())
    except FileNotFoundError:
        return None


def _uv_install(uv: str, python: str, pip_python: str) -> tuple[list[str], dict[str, str]]:
    """uv's install of exact pins into `python`'s venv, from the places `pip_python`'s pip would look: the command
    and its environment (pip's certificates, in the variables uv reads).

    uv reads none of pip's configuration, so its files and PIP_* variables are handed on as uv's options; every
    source is searched for the best match, as pip does (uv's default stops at the first index that has a name,
    which would miss a CPU torch on a second index). It byte-compiles what it installs, as pip does by default, in
    parallel: a run never writes bytecode (PYTHONDONTWRITEBYTECODE, so that nothing is written into the trees), and
    without it every import compiles its source again (torch and transformers 3.5-4.0 s a run, 1.7 s compiled)."""
    from vpatch.upstream import IndexSettings  # lazy: loads the PyPI client (http, ssl); only a venv build needs it

    pip = IndexSettings.from_pip(pip_python, command="install")
    args = [uv, "pip", "install", "--quiet", "--no-deps", "--compile-bytecode", "--python", python,
            "--index-strategy", "unsafe-best-match"]
    if not pip.index_urls:
        args.append("--no-index")
    else:
        args += ["--index-url", pip.index_urls[0]]
        for url in pip.index_urls[1:]:
            args += ["--extra-index-url", url]
    for place in pip.find_links:
        # pip passes over a folder that is not there (a warning); uv stops at it.
        local = Path(place.removeprefix("file://")) if "://" not in place or place.startswith("file://") else None
        if local is None or local.exists():
            args += ["--find-links", place]
    for constraint in pip.constraints:
        args += ["--constraint", constraint]
    for host in pip.trusted_hosts:
        args += ["--allow-insecure-host", host]
    env = {"SSL_CERT_FILE": pip.cert} if pip.cert else {}
    if pip.client_cert:
        env["SSL_CLIENT_CERT"] = pip.client_cert
    return args, env


def _pip_step(args: Sequence[str], what: str, work: Path, env: dict[str, str] | None = None) -> None:
    # pip's (and uv's) temporary build folders go inside the venv's build folder, so they go with it.
    tmp = work / ".pip-tmp"
    tmp.mkdir(exist_ok=True)
    try:
        run_process(args, check=True, merge_output=True, env={**(env or {}), "TMPDIR": str(tmp)},
                    hint="check that pip reaches the package index, then run the command again")
    except ProcessError as exc:
        raise EnvError(f"cannot {what}: {exc.message}", hint=exc.hint) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass(frozen=True)
class LockChange:
    """What refreshing a lock file changed: pins added, removed, and moved (name, old, new)."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    moved: tuple[tuple[str, str, str], ...]


def refresh_lock(path: Path) -> LockChange:
    """Resolve the lock's `# requires:` line afresh, leave out `# omit:`, and rewrite its pins (atomically)."""

    old = Requirements.from_lock(path)
    text = old.source.decode("utf-8", "replace")
    header: dict[str, list[str]] = {"requires": [], "omit": []}
    for line in text.splitlines():
        if match := _HEADER.match(line.strip()):
            header[match.group(1)] += match.group(2).split()
    if not header["requires"]:
        raise EnvError(f"{path}: no '# requires:' line says what to resolve",
                       hint="add e.g. '# requires: torch==2.13.0 numpy' to the lock file's header")
    from packaging.utils import canonicalize_name  # lazy: with the requirement grammar, only where a lock is made

    omit = {canonicalize_name(n) for n in header["omit"]}
    with tempfile.TemporaryDirectory(prefix="vpatch-lock-") as tmp:
        resolved = resolve(header["requires"], Path(tmp))
    _refuse_cuda_torch(resolved)
    pins = sorted((f"{name}=={version}" for name, version in resolved if canonicalize_name(name) not in omit),
                  key=str.lower)
    comments = [line for line in text.splitlines() if line.lstrip().startswith("#") or not line.strip()]
    atomic_write(path, ("\n".join(comments).rstrip("\n") + "\n" + "\n".join(pins) + "\n").encode())
    before = {canonicalize_name(p.split("==")[0]): p.split("==")[1] for p in old.lines}
    after = {canonicalize_name(p.split("==")[0]): p.split("==")[1] for p in pins}
    return LockChange(
        added=tuple(sorted(f"{n}=={after[n]}" for n in after.keys() - before.keys())),
        removed=tuple(sorted(f"{n}=={before[n]}" for n in before.keys() - after.keys())),
        moved=tuple(sorted((n, before[n], after[n]) for n in before.keys() & after.keys() if before[n] != after[n])),
    )


OWNER = ".owner"  # a run folder's lock file: its command holds an flock on it while the folder is in use


def remove_stale_runs(root: Path) -> None:
    """Delete probe run folders no command owns any more (a killed run leaves its extracted tree).

    A folder's owner holds the flock of its `.owner` file: the kernel drops it when the owner ends, however it
    ends, and a vpatch in another PID namespace (a container sharing the cache) holds it as well as one of ours.
    A folder without one (an older vpatch's) goes when its pid is gone."""
    for folder in root.glob("run-*-*") if root.is_dir() else []:
        try:
            fd = os.open(folder / OWNER, os.O_RDONLY)
        except FileNotFoundError:
            pid = folder.name.split("-")[1]
            if pid.isdigit() and not _alive(int(pid)) and not (folder / OWNER).exists():
                shutil.rmtree(folder, ignore_errors=True)
            continue
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # its command runs
        else:
            shutil.rmtree(folder, ignore_errors=True)
        finally:
            os.close(fd)


def own_run_folder(runs: Path, prefix: str) -> tuple[Path, int]:
    """A new run folder under `runs` and the descriptor whose flock owns it (close it once the folder is gone).
    Made under a dot-name and renamed once locked, so that no one sees it unowned."""
    runs.mkdir(parents=True, exist_ok=True)
    making = Path(tempfile.mkdtemp(prefix=f".{prefix}", dir=runs))
    fd = os.open(making / OWNER, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    folder = runs / making.name[1:]
    making.rename(folder)
    return folder, fd


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
