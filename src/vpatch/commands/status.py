"""`vpatch status`: which patches upstream has, with the evidence, and which still need you."""

from __future__ import annotations

import json
from pathlib import Path

from vpatch import upstream
from vpatch.base import ExitCode
from vpatch.commands import console, echo, load_config, load_series, stopped_update, warn_tree_work
from vpatch.probes import workspace as probe_runs
from vpatch.report import ProgressView
from vpatch.report import status as report
from vpatch.series import refuse_unfinished
from vpatch.status import compute as core


def run(*, project: Path, against: list[str], json_out: bool, exit_code: bool, no_probes: bool,
        jobs: int | None = None) -> ExitCode:
    config = load_config(project)
    series = load_series(config)
    refuse_unfinished(series.patches, where="edit the patch file (or amend the commit in the applied tree and export)")
    warn_tree_work(config, "status")
    repo = upstream.open_upstream(config)
    pin, targets = core.resolve_targets(repo, config, against)

    names = {t.commit: t.ref for t in [*targets, pin]}
    with ProgressView() as view, probe_runs.Session(jobs=jobs) as session:
        result = core.compute(
            repo, series.patches, pin=pin, targets=targets, history=config.upstream.source == "git",
            branch=config.upstream.branch,
            probe=None if no_probes else core.probe_fn(repo, config, report=view, names=names, session=session),
            report=view,
        )
    stopped = stopped_update(config)
    if json_out:

        echo(json.dumps({**report.status_json(result),
                         "stopped_update": None if stopped is None else stopped.to_json()}, indent=2))
    else:
        console().print(report.status_table(result))
        if stopped is not None:
            echo(stopped.line())
    return result.exit_code() if exit_code else ExitCode.OK
