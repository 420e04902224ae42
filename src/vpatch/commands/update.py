"""`vpatch update`: move the pin, dropping landed patches with evidence; --continue and --abort."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING

from vpatch import update as core
from vpatch.base import ExitCode, VpatchError, interruptible
from vpatch.commands import console, echo, load_config, warn_tree_work
from vpatch.probes import Witness
from vpatch.report import ProgressView, furthest_lines, update_json, update_lines, update_plan_table

if TYPE_CHECKING:
    from vpatch.config import Config


def run(*, project: Path, to: str | None, dry_run: bool, no_commit: bool, allow_downgrade: bool, no_narrow: bool,
        continue_: bool, abort: bool, json_out: bool, furthest: bool = False, jobs: int | None = None) -> ExitCode:
    _refuse_impossible(to=to, dry_run=dry_run, no_commit=no_commit, allow_downgrade=allow_downgrade,
                       no_narrow=no_narrow, continue_=continue_, abort=abort, furthest=furthest)
    if to is None and not continue_ and not abort:
        return _where(project, json_out=json_out)
    if furthest:
        assert to is not None
        return _furthest(project, to, dry_run=dry_run, no_commit=no_commit, narrow=not no_narrow, json_out=json_out,
                         jobs=jobs)


    config = load_config(project)
    with ProgressView() as view, Witness(None, config, report=view, jobs=jobs) as evidence:
        validator = functools.partial(core.validate_with_probes, evidence=evidence)
        if abort:
            result = core.abort(config)
        elif continue_:
            result = _continue(config, validator)
        else:
            assert to is not None
            warn_tree_work(config, "update --dry-run" if dry_run else "update")
            try:
                result = core.update(config, to, dry_run=dry_run, no_commit=no_commit,
                                     allow_downgrade=allow_downgrade, narrow=not no_narrow,
                                     judge=functools.partial(core.judge_with_status, progress=view, evidence=evidence),
                                     validator=validator, evidence=evidence)
            except core.Refused as refused:
                # a refusal comes after every disposition was decided: a dry run shows them, then the error
                if dry_run and not json_out:
                    planned = core.Result(core.UpdateOutcome.PLANNED, refused.plan)
                    table = update_plan_table(planned)
                    if table is not None:
                        console().print(table)
                    for line in update_lines(planned):
                        echo(line)
                raise
    if json_out:

        echo(json.dumps(update_json(result), indent=2))
    else:

        table = update_plan_table(result)
        if table is not None:
            console().print(table)
        for line in update_lines(result):
            echo(line)
    # a dry run exits as the real run would: one that would stop at a patch exits as the stop does
    would_stop = result.outcome is core.UpdateOutcome.PLANNED and bool(result.plan.files(core.Action.STOP))
    return ExitCode.CONFLICT if result.outcome is core.UpdateOutcome.STOPPED or would_stop else ExitCode.OK


def _refuse_impossible(*, to: str | None, dry_run: bool, no_commit: bool, allow_downgrade: bool, no_narrow: bool,
                       continue_: bool, abort: bool, furthest: bool) -> None:
    """Flags that cannot go together are refused before anything runs (`--abort --dry-run` must not abort)."""
    if continue_ and abort:
        raise VpatchError("--continue and --abort cannot go together", exit_code=ExitCode.USAGE,
                          hint="vpatch update --continue goes on with the stopped update; --abort throws it away")
    if continue_ or abort:
        flag = "--continue" if continue_ else "--abort"
        planning = [name for name, given in (("--to", to is not None), ("--dry-run", dry_run),
                                              ("--no-commit", no_commit), ("--allow-downgrade", allow_downgrade),
                                              ("--no-narrow", no_narrow), ("--furthest", furthest)) if given]
        if planning:
            raise VpatchError(f"{flag} takes none of {', '.join(planning)}: those plan a new update, and {flag} acts "
                              "on the stopped one (nothing was done)", exit_code=ExitCode.USAGE,
                              hint=f"vpatch update {flag} alone; `vpatch update` alone says where the update stands")
        return
    if to is None and (dry_run or no_commit or allow_downgrade or no_narrow or furthest):
        raise VpatchError("these options plan a move of the pin: they need --to REF", exit_code=ExitCode.USAGE,
                          hint="vpatch update --to REF --dry-run (REF: a release newer than the pin, e.g. one "
                               "`vpatch status --against REF` shows); `vpatch update` alone says whether an update "
                               "is stopped")
    if furthest and allow_downgrade:
        raise VpatchError("--furthest goes forward toward --to REF: it takes no --allow-downgrade",
                          exit_code=ExitCode.USAGE, hint=f"vpatch update --to {to} --furthest [--dry-run]")


def _where(project: Path, *, json_out: bool) -> ExitCode:
    """`vpatch update` alone: where the update stands (a stop, an interrupted commit, or none), as `git status`
    says where a rebase stands."""
    config = load_config(project)
    stopped = core.stopped_update(config)
    if json_out:
        echo(json.dumps({"stopped_update": None if stopped is None else stopped.to_json(), "pin": config.pin.ref},
                        indent=2))
    elif stopped is not None:
        echo(stopped.line())
    else:
        echo(f"no update in progress; the pin is {config.pin.ref}. `vpatch update --to REF` moves it "
             "(`--dry-run` first shows what would happen; `vpatch status --against REF` shows each patch there)")
    return ExitCode.OK if stopped is None else ExitCode.CONFLICT


def _continue(config: Config, validator: core.Validator) -> core.Result:
    """--continue; a Ctrl-C or SIGTERM while it runs (its probes take a while) leaves the stop as it was: say how
    to go on. Taken whatever the process inherited (a background job starts with SIGINT ignored)."""
    try:
        with interruptible():
            return core.resume(config, validator=validator)
    except KeyboardInterrupt:
        stopped = core.stopped_update(config)
        if stopped is None:
            raise
        raise VpatchError("interrupted; the update is kept where it was: " + stopped.line(),
                          exit_code=ExitCode.INTERRUPTED,
                          hint="vpatch update --continue again goes on from there (a resolution it had committed in "
                               "the update tree stays committed); vpatch update --abort throws the update away, "
                               "keeping your resolution") from None


def _furthest(project: Path, to: str, *, dry_run: bool, no_commit: bool, narrow: bool, json_out: bool,
              jobs: int | None) -> ExitCode:
    config = load_config(project)
    # one Witness for every candidate's judging and validation: each tree extracted once, one warm interpreter
    with ProgressView() as view, Witness(None, config, report=view, jobs=jobs) as evidence:
        reach = core.update_furthest(config, to, dry_run=dry_run, no_commit=no_commit, narrow=narrow, progress=view,
                                     validator=functools.partial(core.validate_with_probes, evidence=evidence),
                                     evidence=evidence)
    if json_out:

        echo(json.dumps({**reach.to_json(), "patches": update_json(reach.result)["patches"]}, indent=2))
    else:
        table = update_plan_table(reach.result)
        if table is not None:
            console().print(table)
        for line in [*update_lines(reach.result), *furthest_lines(reach)]:
            echo(line)
    return reach.exit_code()
