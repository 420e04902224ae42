"""The one runner for child processes (git, pip, docker CLI, probes) and the record of a finished one.

Every child starts here with the same environment rule: inherited GIT_* variables are dropped
(a git hook or CI step exports GIT_DIR, GIT_WORK_TREE, GIT_INDEX_FILE, which would point vpatch's
git at the wrong repository), except the few that say who the user is or how git reaches remotes.
Additions a caller passes explicitly (a temporary GIT_INDEX_FILE) are applied after the scrub.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from vpatch.base.errors import ProcessError

# How much of a failed command's output its error carries.
TAIL_CHARS = 4000
# How long a group asked to end (SIGTERM) has before it is killed.
GROUP_GRACE_S = 2.0

# Inherited GIT_* variables that survive the scrub: identity and config location (the user's, or a
# test's hermetic one), and how git reaches remotes. None of them can point git at another repository.
_KEPT_GIT_VARS = frozenset({
    "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_AUTHOR_DATE",
    "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "GIT_COMMITTER_DATE",
    "GIT_CONFIG_NOSYSTEM", "GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM", "GIT_CONFIG_COUNT",
    "GIT_EXEC_PATH", "GIT_SSH", "GIT_SSH_COMMAND", "GIT_SSH_VARIANT", "GIT_ASKPASS",
    "GIT_SSL_CAINFO", "GIT_SSL_CAPATH", "GIT_SSL_NO_VERIFY", "GIT_PROXY_COMMAND", "GIT_ALLOW_PROTOCOL",
})
_KEPT_GIT_PREFIXES = ("GIT_CONFIG_KEY_", "GIT_CONFIG_VALUE_")

_PR_SET_PDEATHSIG = 1
# Looked up here, not in the forked child: between fork and exec the child should only make the one call.
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


@dataclass(frozen=True)
class Output:
    returncode: int
    stdout: bytes
    stderr: bytes

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def err(self) -> str:
        return self.stderr.decode("utf-8", "replace")


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without repository-locating GIT_* variables, plus `extra`."""
    env = {
        key: value for key, value in os.environ.items()
        if not key.startswith("GIT_") or key in _KEPT_GIT_VARS or key.startswith(_KEPT_GIT_PREFIXES)
    }
    # A child must never wait for a password on a terminal nobody watches.
    env["GIT_TERMINAL_PROMPT"] = "0"
    if extra:
        env.update(extra)
    return env


def run(
    argv: Sequence[str],
    *,
    cwd: Path | None = None,
    input: bytes | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    timeout: float | None = None,
    merge_output: bool = False,
    own_group: bool = False,
    cancel: threading.Event | None = None,
    die_with_parent: bool = False,
    shown: Sequence[str] | None = None,
    hint: str | None = None,
    error: type[ProcessError] = ProcessError,
) -> Output:
    """Run `argv` to completion, capturing its output.

    `die_with_parent` (Linux): the kernel kills the child (SIGKILL) when vpatch ends, however it ends (kill -9,
    SIGTERM), so that it cannot go on writing into a folder the next command cleans (a tree being extracted).
    It costs a fork instead of a vfork, so it is for the long commands whose work lands in vpatch's own folders.

    `own_group`: the child leads a new process group, and a timeout kills the whole group (what
    the child started too, e.g. a probe's workers), not just the child. `cancel` (with `own_group`): once it
    is set, the group is killed and `error` raised (returncode None), e.g. when a parallel run's command fails.

    `check`: a non-zero exit raises `error`. A command that cannot start or runs past `timeout`
    always raises `error` (returncode None; `timed_out` tells which). `merge_output` sends stderr into stdout (one stream, in order).
    `shown` is how errors name the command (default: argv).
    """
    command = tuple(argv)
    preexec = _dies_with(os.getpid()) if die_with_parent and _prctl is not None else None
    try:
        if own_group:
            proc = _run_group(command, cwd=cwd, input=input, env=child_env(env), timeout=timeout,
                              merge_output=merge_output, cancel=cancel, preexec=preexec)
        else:
            proc = subprocess.run(
                command, cwd=cwd, input=input, env=child_env(env), timeout=timeout, check=False,
                stdin=None if input is not None else subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT if merge_output else subprocess.PIPE, preexec_fn=preexec,
            )
    except subprocess.TimeoutExpired as exc:
        output = _tail(_as_bytes(exc.stdout) + _as_bytes(exc.stderr))
        raise error(f"{_name(shown or command)} timed out after {timeout:g}s" + (f"\n{output}" if output else ""),
                    command=command, returncode=None, output=output, timed_out=True, hint=hint) from None
    except _Cancelled as exc:
        raise error(f"{_name(shown or command)} was cancelled", command=command, returncode=None,
                    output=_tail(exc.output), hint=hint) from None
    except OSError as exc:
        raise _not_started(command, shown, exc, error, hint) from exc
    result = Output(proc.returncode, proc.stdout, proc.stderr or b"")
    if check and result.returncode != 0:
        raise failure(command, result, shown=shown, hint=hint, error=error)
    return result


def _dies_with(parent: int) -> Callable[[], None]:
    """What a child runs between fork and exec to die with `parent` (PR_SET_PDEATHSIG). The signal comes when the
    thread that started the child ends; `run` waits for its child in that thread, so that is when vpatch ends."""
    def arm() -> None:
        assert _prctl is not None
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the call: no signal will come
            os._exit(1)
    return arm


class _Cancelled(Exception):
    def __init__(self, output: bytes) -> None:
        super().__init__("cancelled")
        self.output = output


def _run_group(command: tuple[str, ...], *, cwd: Path | None, input: bytes | None, env: Mapping[str, str],
               timeout: float | None, merge_output: bool, cancel: threading.Event | None = None,
               preexec: Callable[[], None] | None = None) -> subprocess.CompletedProcess[bytes]:
    """subprocess.run in a new session; on timeout, cancel (or any interruption) the whole group is killed."""
    with subprocess.Popen(command, cwd=cwd, env=env, start_new_session=True, preexec_fn=preexec,
                          stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merge_output else subprocess.PIPE) as proc:
        try:
            stdout, stderr = _communicate(proc, input, timeout, cancel)
        except BaseException:
            _end_group(proc)
            stdout, stderr = proc.communicate()
            if isinstance(sys.exc_info()[1], subprocess.TimeoutExpired):
                raise subprocess.TimeoutExpired(command, timeout or 0, stdout, stderr) from None
            if isinstance(sys.exc_info()[1], _Cancelled):
                raise _Cancelled(_as_bytes(stdout) + _as_bytes(stderr)) from None
            raise
        # The child may be gone while what it started lives on in its group: end that too.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


def _end_group(proc: subprocess.Popen[bytes]) -> None:
    """End a child's group: SIGTERM first, so that a supervisor among them can end what left the group (a daemon
    in a session of its own), then SIGKILL to whatever is left of it."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=GROUP_GRACE_S)
    except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _communicate(proc: subprocess.Popen[bytes], input: bytes | None, timeout: float | None,
                 cancel: threading.Event | None) -> tuple[bytes, bytes]:
    if cancel is None:
        return proc.communicate(input, timeout=timeout)
    # communicate() may be called again after its timeout (the output read so far is kept): look at
    # `cancel` a few times a second while waiting for the child
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        if cancel.is_set():
            raise _Cancelled(b"")
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise subprocess.TimeoutExpired(proc.args, timeout or 0)
        try:
            return proc.communicate(input, timeout=0.2 if left is None else min(0.2, left))
        except subprocess.TimeoutExpired:
            input = None  # written already: a retry must not send it again


def stream(
    argv: Sequence[str],
    on_line: Callable[[str], None],
    *,
    cwd: Path | None = None,
    input: bytes | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    shown: Sequence[str] | None = None,
    hint: str | None = None,
    error: type[ProcessError] = ProcessError,
) -> Output:
    """Run `argv`, handing each line of its merged stdout/stderr to `on_line` as it comes (`input`: written to
    its stdin meanwhile, then closed).

    The result's stdout holds only the output tail, so a chatty build never sits in memory whole.
    """
    command = tuple(argv)
    recent: deque[str] = deque()
    size = 0
    try:
        proc = subprocess.Popen(command, cwd=cwd, env=child_env(env),
                                stdin=subprocess.DEVNULL if input is None else subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except OSError as exc:
        raise _not_started(command, shown, exc, error, hint) from exc
    assert proc.stdout is not None
    writer = None if input is None else threading.Thread(target=_write_all, args=(proc.stdin, input), daemon=True)
    if writer is not None:
        writer.start()  # beside the reads: a child that writes before it has read all its input cannot block us
    try:
        pending = b""
        # A line ends at "\n" or at "\r" (how git and pip redraw a progress counter in place).
        while chunk := os.read(proc.stdout.fileno(), 65536):
            *lines, pending = (pending + chunk).replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
            for raw in lines:
                line = raw.decode("utf-8", "replace")
                recent.append(line)
                size += len(line) + 1
                while size > TAIL_CHARS and len(recent) > 1:
                    size -= len(recent.popleft()) + 1
                on_line(line)
        if pending:
            recent.append(pending.decode("utf-8", "replace"))
            on_line(recent[-1])
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        if writer is not None:
            writer.join()
    result = Output(proc.wait(), "\n".join(recent).encode(), b"")
    if check and result.returncode != 0:
        raise failure(command, result, shown=shown, hint=hint, error=error)
    return result


def _write_all(pipe: IO[bytes] | None, data: bytes) -> None:
    """Write `data` to a child's stdin and close it; a child that exits early (a broken pipe) just stops it."""
    assert pipe is not None
    try:
        pipe.write(data)
    except (BrokenPipeError, OSError):
        pass
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def feed(
    argv: Sequence[str],
    chunks: Iterable[bytes],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    shown: Sequence[str] | None = None,
    hint: str | None = None,
    error: type[ProcessError] = ProcessError,
) -> Output:
    """Run `argv` with `chunks` written to its stdin as they are produced (a large stream never sits whole
    in memory); its stdout and stderr go to files, so a child that writes a lot cannot block on a full pipe."""
    command = tuple(argv)
    with tempfile.TemporaryFile() as out_file, tempfile.TemporaryFile() as err_file:
        try:
            proc = subprocess.Popen(command, cwd=cwd, env=child_env(env), stdin=subprocess.PIPE,
                                    stdout=out_file, stderr=err_file)
        except OSError as exc:
            raise _not_started(command, shown, exc, error, hint) from exc
        assert proc.stdin is not None
        try:
            for chunk in chunks:
                proc.stdin.write(chunk)
            proc.stdin.close()
        except BrokenPipeError:
            pass  # the child stopped reading: its exit code and stderr say why
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        returncode = proc.wait()
        out_file.seek(0)
        err_file.seek(0)
        result = Output(returncode, out_file.read(), err_file.read())
    if check and result.returncode != 0:
        raise failure(command, result, shown=shown, hint=hint, error=error)
    return result


class Child:
    """A long-lived child spoken to over its stdin and stdout, one request at a time (`git cat-file --batch`).

    Its stderr goes to a temporary file, so a child that complains cannot block on a full pipe, and what it said
    ends up in the error `failed` builds.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        shown: Sequence[str] | None = None,
        hint: str | None = None,
        error: type[ProcessError] = ProcessError,
    ) -> None:
        self.command, self.shown, self.hint, self.error = tuple(argv), shown, hint, error
        self._stderr = tempfile.TemporaryFile()
        try:
            self._proc = subprocess.Popen(self.command, cwd=cwd, env=child_env(env), stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=self._stderr)
        except OSError as exc:
            self._stderr.close()
            raise _not_started(self.command, shown, exc, error, hint) from exc
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self.stdin, self.stdout = self._proc.stdin, self._proc.stdout

    def running(self) -> bool:
        return self._proc.poll() is None

    def failed(self, what: str) -> ProcessError:
        """The error for a conversation that broke off (`what`: how), with the child's exit code and stderr."""
        self._end()
        self._stderr.seek(0)
        output = _tail(self._stderr.read())
        self._stderr.close()
        return self.error(f"{_name(self.shown or self.command)}: {what} (exit code {self._proc.returncode})"
                          + (f"\nstderr:\n{output}" if output else ""),
                          command=self.command, returncode=self._proc.returncode, output=output, hint=self.hint)

    def close(self) -> None:
        """End the conversation: the child sees the end of its input and exits; one that does not is killed."""
        self._end()
        self._stderr.close()

    def _end(self) -> None:
        for pipe in (self.stdin, self.stdout):
            try:
                pipe.close()
            except OSError:
                pass  # a broken pipe to a child that is gone already
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def failure(
    command: Sequence[str],
    result: Output,
    *,
    shown: Sequence[str] | None = None,
    hint: str | None = None,
    error: type[ProcessError] = ProcessError,
) -> ProcessError:
    """The error for a command that exited non-zero: command, exit code, and the tail of what it printed."""
    parts = [f"{_name(shown or command)} failed with exit code {result.returncode}"]
    if result.stdout.strip():
        parts.append("stdout:\n" + _tail(result.stdout))
    if result.stderr.strip():
        parts.append("stderr:\n" + _tail(result.stderr))
    return error("\n".join(parts), command=tuple(command), returncode=result.returncode,
                 output=_tail(result.stdout + result.stderr), hint=hint)


def _not_started(command: tuple[str, ...], shown: Sequence[str] | None, exc: OSError,
                 error: type[ProcessError], hint: str | None) -> ProcessError:
    program = command[0] if command else "?"
    if exc.errno == errno.E2BIG:
        # Not a missing program: the kernel refused the arguments (each at most 128 KiB, all together ARG_MAX).
        longest = max(range(len(command)), key=lambda i: len(command[i]))
        start = _name([w if len(w) <= 40 else w[:37] + "..." for w in command[:3]])
        return error(f"cannot run {start} …: the argument list is too long (argument {longest} is "
                     f"{len(command[longest].encode()):,} bytes; Linux takes at most 131,072 per argument)",
                     command=command, returncode=None, output="", hint=hint or "shorten the value that became that argument")
    return error(f"cannot run {_name(shown or command)}: {exc.strerror or exc}", command=command, returncode=None,
                 output="", hint=hint or f"is {Path(program).name} installed and on PATH?")


def _name(command: Sequence[str]) -> str:
    return " ".join(command)


def _as_bytes(data: bytes | str | None) -> bytes:
    if data is None:
        return b""
    return data.encode() if isinstance(data, str) else data


def _tail(data: bytes) -> str:
    return data.decode("utf-8", "replace")[-TAIL_CHARS:].strip()


@contextmanager
def interruptible() -> Iterator[None]:
    """Ctrl-C and SIGTERM (an SSH drop, `kill`) both raise KeyboardInterrupt here, whatever the process
    inherited: a shell starts background jobs with SIGINT ignored, and Python then never installs its own
    handler, so without this an operator's Ctrl-C (or a test's SIGINT) would be ignored (by a deploy, by an update's --continue)."""
    def interrupt(_signum: int, _frame: object) -> None:
        # One interrupt is enough: a second Ctrl-C must not break into the rollback this one starts.
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt

    previous: dict[signal.Signals, object] = {}
    previous.update({s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)})
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
