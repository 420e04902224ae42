"""The one error type vpatch raises for things a person can fix, with exit codes and hints."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit codes; documented in the README."""

    OK = 0
    ERROR = 1  # any error: bad input, failed command, missing tool
    USAGE = 2  # bad command line (typer/click's own code)
    LANDED = 3  # status --exit-code: some patch has landed and can be dropped
    ATTENTION = 4  # status --exit-code: some patch conflicts or is only partly upstream
    CONFLICT = 5  # apply/update stopped on a patch that does not apply
    ROLLED_BACK = 6  # deploy: a check failed; the old production container is back and healthy
    DRIFT = 7  # serve --diff: the running container differs from the yaml
    UNFINISHED = 8  # deploy --status: a deploy did not finish (production may be parked); --rollback restores it
    PARTWAY = 9  # update --furthest: the pin moved (or would), but a patch needs a person before it can go further
    INTERRUPTED = 130


# What each exit code means, clause by clause: the README's table ("; "-joined) and the --exit-code help (the
# clauses of one command) are made from this one table.
MEANINGS: dict[ExitCode, tuple[str, ...]] = {
    ExitCode.OK: ("success", "for `status --exit-code`: nothing to do"),
    ExitCode.ERROR: ("error (bad input, failed command)", "the message says what is wrong, `hint:` what to do",
                     "`serve --check`: the server is not alive"),
    ExitCode.USAGE: ("bad command line",),
    ExitCode.LANDED: ("`status --exit-code`: some patch has landed upstream and can be dropped",),
    ExitCode.ATTENTION: ("`status --exit-code`: some patch needs a person: it conflicts, is only partly upstream, is "
                         "*disputed* (identity evidence says landed, the content says not), its probe is *invalid* "
                         "(passes on the pin), or it breaks one of upstream's own tests on the pin (a *regression*)",
                         "`update --furthest`: such a patch blocks the first step toward the target, nothing changed"),
    ExitCode.CONFLICT: ("a patch does not apply (`apply`, `update`, `forward`): the message names patch, file and hunk",),
    ExitCode.ROLLED_BACK: ("`deploy`: a check failed and vpatch rolled back",
                           "the old production container is running again, verified healthy"),
    ExitCode.DRIFT: ("`serve --diff`: the running container differs from the yaml (each difference is listed)",),
    ExitCode.UNFINISHED: ("`deploy --status`: a deploy did not finish (production may be parked)",
                          "`deploy --rollback` restores it"),
    ExitCode.PARTWAY: ("`update --furthest` (and `scripts/ci-rebuild`): the pin moved (or, `--dry-run`, would move) "
                       "short of the target", "a patch needs a person to go further, and is named"),
    ExitCode.INTERRUPTED: ("interrupted (`deploy`: after rolling back by itself)",),
}


def meaning(code: ExitCode) -> str:
    """The README's words for an exit code."""
    return "; ".join(MEANINGS[code])


def exit_code_help(*codes: ExitCode, scope: str) -> str:
    """An --exit-code option's help: each code with what it means for the command `scope` names, from MEANINGS."""
    said = []
    for code in codes:
        clauses = [c.removeprefix(scope) for c in MEANINGS[code] if c.startswith(scope)]
        said.append(f"exit {int(code)}: " + "; ".join(clauses).replace("*", ""))
    return "; ".join(said) + "."


class VpatchError(Exception):
    """An error the user can act on: a message, an optional hint, an exit code."""

    exit_code: ExitCode = ExitCode.ERROR

    def __init__(self, message: str, *, hint: str | None = None, exit_code: ExitCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code


class ConfigError(VpatchError):
    """vpatch.yaml or an image definition is unreadable or invalid."""


class SeriesError(VpatchError):
    """A patch file is malformed or the series is inconsistent."""


class ProcessError(VpatchError):
    """A child process failed, timed out or could not start: its command, exit code and output tail."""

    def __init__(
        self,
        message: str,
        *,
        command: tuple[str, ...],
        returncode: int | None,
        output: str,
        timed_out: bool = False,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.command = command
        self.returncode = returncode  # None: it never started, or was killed at its timeout
        self.output = output
        self.timed_out = timed_out


class GitError(ProcessError):
    """A git command failed; the message carries the command and its output."""


class ApplyError(VpatchError):
    """A patch does not apply onto the target."""

    exit_code = ExitCode.CONFLICT


class UpstreamError(VpatchError):
    """Upstream vLLM cannot be fetched or read (mirror, PyPI sdist, release history)."""


class JournalError(VpatchError):
    """A journal vpatch keeps to finish or undo interrupted work (update's commit journal and stop state, the
    deploy journal, the record of the applied tree) is unreadable; the message names the file, the hint what to do."""
