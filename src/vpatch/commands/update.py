"""`vpatch update`: move the pin, dropping landed patches with evidence; --continue and --abort."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from vpatch import update as core
from vpatch.base import ExitCode, VpatchError
from vpatch.commands import console, echo, load_config, warn_tree_work
from vpatch.probes import Witness
from vpatch.report import ProgressView
from vpatch.report import status as report
from vpatch.report import update as update_report
from vpatch.status import Status


def run(*, project: Path, to: str | None, dry_run: bool, no_commit: bool, allow_downgrade: bool, no_narrow: bool,
        continue_: bool, abort: bool, json_out: bool, furthest: bool = False, jobs: int | None = None) -> ExitCode:
    if sum(bool(x) for x in (to, continue_, abort)) != 1:
        raise VpatchError("give exactly one of --to REF, --continue, --abort", exit_code=ExitCode.USAGE,
                          hint="vpatch update --to v0.31.0 [--dry-run]")
    if furthest and (to is None or allow_downgrade):
        raise VpatchError("--furthest goes forward toward --to REF: it needs --to and takes no --allow-downgrade",
                          exit_code=ExitCode.USAGE, hint="vpatch update --to v0.33.0 --furthest [--dry-run]")
    if furthest:
        assert to is not None
        return _furthest(project, to, dry_run=dry_run, no_commit=no_commit, narrow=not no_narrow, json_out=json_out)


    config = load_config(project)
    with ProgressView() as view, Witness(None, config, report=view, jobs=jobs) as evidence:
        validator = functools.partial(core.validate_with_probes, evidence=evidence)
        if abort:
            result = core.abort(config)
        elif continue_:
            result = core.resume(config, validator=validator)
        else:
            assert to is not None
            warn_tree_work(config, "update --dry-run" if dry_run else "update")
            try:
                result = core.update(config, to, dry_run=dry_run, no_commit=no_commit,
                                     allow_downgrade=allow_downgrade, narrow=not no_narrow,
                                     judge=functools.partial(core.judge_with_status, progress=view, evidence=evidence),
                                     validator=validator)
            except core.Refused as refused:
                # the dry run's refusal comes after the judging: show the table it refused on, then the error

                if isinstance(refused.report, Status) and not json_out:
                    console().print(report.status_table(refused.report))
                raise
    if json_out:

        echo(json.dumps(result.to_json(), indent=2))
    else:

        table = update_report.plan_table(result)
        if table is not None:
            console().print(table)
        for line in update_report.update_lines(result):
            echo(line)
    return ExitCode.CONFLICT if result.outcome is core.UpdateOutcome.STOPPED else ExitCode.OK


def _furthest(project: Path, to: str, *, dry_run: bool, no_commit: bool, narrow: bool, json_out: bool) -> ExitCode:
    config = load_config(project)
    with ProgressView() as view:
        reach = core.update_furthest(config, to, dry_run=dry_run, no_commit=no_commit, narrow=narrow, progress=view,
                                     validator=functools.partial(core.validate_with_probes,
                                                                 evidence=Witness(None, config, report=view)))
    if json_out:

        echo(json.dumps(reach.to_json(), indent=2))
    else:
        table = update_report.plan_table(reach.result)
        if table is not None:
            console().print(table)
        for line in [*update_report.update_lines(reach.result), *update_report.furthest_lines(reach)]:
            echo(line)
    return reach.exit_code()
