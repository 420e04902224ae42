"""The deploy journal: where a switch stands, written before each step, so any interruption is recoverable.

It lives in the host's vpatch state folder ($VPATCH_STATE, else $XDG_STATE_HOME/vpatch, else
~/.local/state/vpatch), one file per image definition: it describes containers on this host's docker
daemon, not a checkout, so a second checkout or a fresh clone finds it; and it is state, not cache
(deleting ~/.cache must never lose the way back to the parked production container).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from enum import Enum
from pathlib import Path

from vpatch.errors import ConfigError
from vpatch.fs import atomic_write


class Phase(str, Enum):
    BASELINE = "baseline"  # measuring production; nothing changed yet
    PARKING = "parking"  # renaming/stopping production (parked_id names it, whatever its name is now)
    STARTING = "starting"  # production is parked; the candidate is being created under the production name
    CHECKING = "checking"  # the candidate runs and is being checked
    ROLLING_BACK = "rolling-back"
    DEPLOYED = "deployed"  # final: the candidate passed and serves; the parked container stays parked
    ROLLED_BACK = "rolled-back"  # final: production is back and was verified healthy

    @property
    def settled(self) -> bool:
        """Nothing is half-done: production was never touched (baseline), or the deploy ended."""
        return self in (Phase.BASELINE, Phase.DEPLOYED, Phase.ROLLED_BACK)


@dataclass(frozen=True)
class Journal:
    definition: str  # images/<definition>.yaml
    container: str  # the production container name (the candidate takes it over)
    image: str  # the candidate image
    phase: Phase
    started: str  # ISO time the deploy began; also the suffix of parked/candidate names
    parked_id: str | None = None  # the production container's id (stable across the rename)
    parked_name: str | None = None
    parked_restart: str | None = None  # its restart policy before parking, restored on rollback
    candidate_started: bool = False  # set before `docker run`: from then on the production name may be the candidate's
    candidate_id: str | None = None
    candidate_kept_as: str | None = None  # the name a rolled-back candidate keeps (with its logs)
    note: str = ""
    # What a rollback needs besides the daemon, so it never depends on images/<name>.yaml still parsing.
    port: int | None = None  # where production answers (serve.port)
    health_timeout_s: float | None = None  # how long a restored production container may take to be alive

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port or 8000}"

    @staticmethod
    def folder() -> Path:
        if os.environ.get("VPATCH_STATE"):
            return Path(os.environ["VPATCH_STATE"]) / "deploy"
        base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
        return base / "vpatch" / "deploy"

    @classmethod
    def path_for(cls, definition: str) -> Path:
        return cls.folder() / f"{definition}.json"

    @property
    def path(self) -> Path:
        return self.path_for(self.definition)

    @classmethod
    def load(cls, definition: str) -> Journal | None:
        path = cls.path_for(definition)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            data["phase"] = Phase(data["phase"])
            return cls(**data)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise ConfigError(f"the deploy journal {path} is unreadable: {exc}",
                              hint="inspect it and the containers (`docker ps -a`); remove it only once production is sound") from exc

    def save(self) -> Journal:
        data = asdict(self)
        data["phase"] = self.phase.value
        atomic_write(self.path, (json.dumps(data, indent=2) + "\n").encode())
        return self

    def advance(self, phase: Phase, **changes: str | bool | int | float | None) -> Journal:
        """The journal moved to `phase` (with `changes`), written to disk before the step it announces."""
        return replace(self, phase=phase, **changes).save()  # type: ignore[arg-type]
