"""`vpatch verify`: an image against its own labels, optionally its probes and live checks."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from vpatch.base import ExitCode, VpatchError, atomic_write, cache_dir
from vpatch.commands import echo, load_config, progress
from vpatch.deploy import Journal, stamp, verify_live
from vpatch.docker import Docker
from vpatch.image import CheckKind, verify_image
from vpatch.report import check_lines, live_lines, live_page, live_summary, matched_line, page_line

if TYPE_CHECKING:
    from vpatch.config import Config


def run(*, project: Path, image: str, probes: bool, live: bool, definition: str | None) -> ExitCode:
    if definition is not None and not live:
        raise VpatchError("--definition names the image definition that --live starts the image with",
                          hint=f"vpatch verify {image} --live --definition {definition}")
    config = load_config(project)
    report = verify_image(config, image, probes=probes)
    for line in check_lines(report):
        echo(line)
    if report.ok and live:
        _verify_live(config, image, definition)
    if not report.ok:
        failed = [c for c in report.checks if not c.ok]
        only_probes = all(c.kind is CheckKind.PROBE for c in failed)
        raise VpatchError(f"image {image} does not match its labels: {len(failed)} check(s) failed",
                          hint="a probe's FAIL: the fix is not in the image; ERROR: the probe could not decide (a crash, "
                          "a timeout, a missing file: it may need vLLM's dependencies, which an official image has)" if only_probes
                          else "rebuild it with `vpatch build`")
    echo(matched_line(image, report))
    return ExitCode.OK


def _verify_live(config: Config, image: str, definition: str | None) -> None:
    started = stamp()
    result = verify_live(config, image, definition=definition, docker=Docker.connect(), cache=cache_dir(),
                                     progress=progress)
    for line in live_lines(result):
        echo(line)
    # The page beside the deploys' reports, written before a failure is raised: the failing cases are on it.
    page = Journal.folder() / "reports" / f"verify-{started}-{image.replace('/', '_').replace(':', '_')}.html"
    atomic_write(page, live_page(image, result, started=started).encode(), durable=False)
    echo(page_line(page))
    failed = [o for o in result.candidate if not o.ok]
    if failed:
        raise VpatchError(f"image {image} fails the live check of {', '.join(o.planned.patch for o in failed)}",
                          hint="the fix does not show through the server; `vpatch verify --live` again after "
                          "fixing the patch and rebuilding")
    echo(live_summary(result))
