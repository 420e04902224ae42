"""Each target's dispositions kept in the cache (`vpatch status`), under everything they are decided from: a second
`status` decides nothing again, and a change to any of it (a patch, a probe, a verdict's facts, vpatch) decides
again."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from vpatch import __version__
from vpatch.base import atomic_write, cache_dir
from vpatch.series import Series
from vpatch.update.plan import PatchPlan, UpdatePlan

if TYPE_CHECKING:
    from vpatch.config import Config
    from vpatch.status import Target


_FOLDER = "dispositions"
_HERE = Path(__file__).parent


def key(config: Config, series: Series, rows: Sequence[PatchPlan], *, pin: str, target: Target, probes: bool) -> str:
    """What a target's dispositions are decided from: vpatch's version, both commits, the verdicts' facts (step 1's
    rows), every file of the series folder (patches, probes, their scripts), whether the Live-Checks exist, and the
    source of the rooms that decide (update/, verdict/)."""
    digest = hashlib.sha256()
    facts = {"version": __version__, "pin": pin, "target": [target.ref, target.commit], "probes": probes,
             "config": [config.pin.ref, config.upstream.source, config.upstream.branch],
             "rows": [asdict(r) for r in rows],
             "live": [str(p.live_check_path(config.root)) + str((p.live_check_path(config.root) or Path()).is_file())
                      for p in series if p.live_check]}
    digest.update(json.dumps(facts, sort_keys=True, default=str).encode())
    # the deciding code itself: a checkout whose version did not move but whose rules did decides again
    for source in sorted((*_HERE.glob("*.py"), *(_HERE.parent / "verdict").glob("*.py"))):
        digest.update(source.read_bytes())
    for path in sorted(series.directory.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(series.directory)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:32]


def load(key: str) -> list[PatchPlan] | None:
    """The dispositions kept under `key`, or None (decide them)."""
    path = cache_dir() / _FOLDER / f"{key}.json"
    try:
        return list(UpdatePlan.from_dict(json.loads(path.read_text(encoding="utf-8"))).patches)
    except (OSError, ValueError, KeyError, TypeError):
        return None  # not there, or written by another version: decided again


def keep(key: str, plan: UpdatePlan) -> None:
    """Keep a target's dispositions (the rows of `plan`) under `key`, written atomically."""
    folder = cache_dir() / _FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / f"{key}.json", json.dumps(plan.to_dict(), sort_keys=True).encode(), durable=False)
