"""`vpatch forward`: send a needed patch upstream with the test that proves it; `--record URL` once it is sent."""

from __future__ import annotations

import json
from pathlib import Path

from vpatch import forward as core
from vpatch.base import ExitCode, VpatchError
from vpatch.commands import echo, load_config
from vpatch.probes import Witness
from vpatch.report import ProgressView, forward_json, forward_lines, recorded_line


def run(*, project: Path, patch: str, onto: str | None, record: str | None, continue_: bool, json_out: bool,
        jobs: int | None = None) -> ExitCode:
    config = load_config(project)
    if record is not None:
        if onto is not None or continue_:
            raise VpatchError("--record takes neither --onto nor --continue", exit_code=ExitCode.USAGE,
                              hint="vpatch forward NNNN --record URL writes where the patch went, nothing else")
        recorded = core.record_forwarded(config, patch, record)
        echo(json.dumps(recorded.to_json(), indent=2) if json_out else recorded_line(recorded))
        return ExitCode.OK
    if continue_ and onto is not None:
        raise VpatchError("--continue takes no --onto: it goes on onto the ref it stopped at",
                          exit_code=ExitCode.USAGE, hint=f"vpatch forward {patch} --continue")
    with ProgressView() as view, Witness(None, config, report=view, jobs=jobs) as evidence:
        if continue_:
            done: core.Submission | core.ForwardStop = core.continue_forward(config, patch, evidence=evidence, progress=view)
        else:
            done = core.forward_patch(config, patch, onto=onto, evidence=evidence, progress=view)
    if json_out:
        echo(json.dumps(forward_json(done), indent=2))
    else:
        for line in forward_lines(done):
            echo(line)
    return ExitCode.CONFLICT if isinstance(done, core.ForwardStop) else ExitCode.OK
