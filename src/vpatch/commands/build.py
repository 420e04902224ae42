"""`vpatch build`: the production image for the pin plus the series."""

from __future__ import annotations

from pathlib import Path

from vpatch.base import ExitCode
from vpatch.commands import echo, load_config, progress, warn_tree_work
from vpatch.config import Strategy
from vpatch.image import build_image, describe, plan_build, plan_command
from vpatch.report import built_lines


def run(*, project: Path, name: str, plan: bool, push: bool, strategy: Strategy | None, base: str | None) -> ExitCode:
    config = load_config(project)
    warn_tree_work(config, "build")
    if plan:
        result = plan_build(config, name, strategy=strategy, base=base)
        for line in describe(result, plan_command(result)):
            echo(line)
        return ExitCode.OK
    # Build progress goes to stderr; stdout keeps only the result (scripts read the tags from it).
    built = build_image(config, name, strategy=strategy, base=base, push=push, progress=progress)
    for line in built_lines(built):
        echo(line)
    return ExitCode.OK
