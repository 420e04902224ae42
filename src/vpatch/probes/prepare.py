"""The probe venvs a series will need, built early: beside other work (the release history's downloads), so
that the first status finds them ready instead of waiting for them before its first probe."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from vpatch.base import Reporter, VpatchError, silent
from vpatch.probes.env import Requirements, probe_venv
from vpatch.probes.file import probe_for
from vpatch.probes.outcome import ProbeKind
from vpatch.probes.regression import requirements_for
from vpatch.series import Patch


def venvs_for(patches: Sequence[Patch]) -> tuple[Requirements, ...]:
    """Every venv the series' command probes and upstream's tests of its patches run in, each once."""
    found: dict[str, Requirements] = {}
    for patch in patches:
        probe = probe_for(patch)
        wanted = [requirements_for(patch, probe)]
        if probe is not None and probe.kind is ProbeKind.COMMAND:
            wanted.append(probe.environment())
        for requirements in wanted:
            if requirements is not None and requirements.lines:
                found.setdefault(requirements.key(), requirements)
    return tuple(found.values())


@contextmanager
def venvs_beside(patches: Sequence[Patch], *, cache: Path | None = None, report: Reporter = silent) -> Iterator[None]:
    """Build the series' probe venvs in a thread while the block runs; wait for them at its end (not when the
    block fails: the build goes on in the background until this process ends, and the next build cleans it up).

    A venv that cannot be built (or a probe file that cannot be read) is not the block's failure: its progress
    says so, and the first command that needs the venv meets the error again, with its hint."""
    try:
        wanted = venvs_for(patches)
    except VpatchError:
        wanted = ()  # a broken probe file: status names it; nothing to start early

    def build() -> None:
        for requirements in wanted:
            try:
                probe_venv(requirements, cache=cache, report=report)
            except VpatchError:
                pass  # reported as failed by probe_venv; the command that needs it raises it with its hint

    worker = threading.Thread(target=build, name="probe-venvs", daemon=True)
    if wanted:
        worker.start()
    yield
    if wanted:
        worker.join()
