"""`vpatch status`: which patches upstream has, with the evidence, and which still need you."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from vpatch import status as core
from vpatch import update, upstream
from vpatch.base import ExitCode
from vpatch.commands import console, echo, load_config, load_series, stopped_update, warn_tree_work
from vpatch.probes import Witness
from vpatch.report import ProgressView, status_json, status_table
from vpatch.series import refuse_unfinished


def run(*, project: Path, against: list[str], json_out: bool, exit_code: bool, no_probes: bool,
        jobs: int | None = None) -> ExitCode:
    config = load_config(project)
    series = load_series(config)
    refuse_unfinished(series.patches, where="edit the patch file (or amend the commit in the applied tree and export)")
    warn_tree_work(config, "status")
    repo = upstream.open_upstream(config)
    pin, targets = core.resolve_targets(repo, config, against)

    with ProgressView(phases=True) as view, Witness(repo, config, report=view, jobs=jobs) as evidence:
        result = core.compute_status(
            repo, series.patches, pin=pin, targets=targets, history=config.upstream.source == "git",
            branch=config.upstream.branch, evidence=None if no_probes else evidence, report=view,
        )
        # what an update to each target does with each patch, decided as the update decides it (with its proofs)
        validator = None if no_probes else functools.partial(update.validate_with_probes, evidence=evidence)
        dispositions = update.dispose_status(repo, config, series, result, validator=validator, progress=view,
                                              evidence=None if no_probes else evidence)
    stopped = stopped_update(config)
    forwarded = {p.filename: sent for p in series.patches if (sent := p.forwarded) is not None}
    if json_out:

        echo(json.dumps({**status_json(result, dispositions, forwarded),
                         "stopped_update": None if stopped is None else stopped.to_json()}, indent=2))
    else:
        console().print(status_table(result, dispositions, forwarded))
        if stopped is not None:
            echo(stopped.line())
    return dispositions.exit_code() if exit_code else ExitCode.OK
