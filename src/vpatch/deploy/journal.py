"""The deploy journal: where a switch stands, written before each step, so any interruption is recoverable.

It lives in the host's vpatch state folder ($VPATCH_STATE, else $XDG_STATE_HOME/vpatch, else
~/.local/state/vpatch), one file per image definition: it describes containers on this host's docker
daemon, not a checkout, so a second checkout or a fresh clone finds it; and it is state, not cache
(deleting ~/.cache must never lose the way back to the parked production container).
"""

from __future__ import annotations

import math
import re
from dataclasses import MISSING, asdict, dataclass, fields, replace
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any, NoReturn

from vpatch.base import ConfigError, JournalError, json_kind, json_shown, load_record, save_record, state_dir
from vpatch.config import definition_name_ok
from vpatch.serve import base_url

_HINT = "inspect it and the containers (`docker ps -a`); remove it only once production is sound"


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
    # Added later (an older journal lacks them; each has a default that keeps its old meaning).
    host: str | None = None  # serve.host: where production listens (the health wait asks there)
    model: str | None = None  # the name /v1/models must list: an answer from another server is no answer
    restore_timeout_s: float | None = None  # the larger of serve.health_timeout and deploy.health_timeout_s
    parked_label: str | None = None  # the definition label production carried when it was parked ("" none)

    @property
    def url(self) -> str:

        return base_url(self.port or 8000, self.host)

    @property
    def restore_wait_s(self) -> float:
        """How long a restored production container may take to be alive: the longer of what its definition
        gives a start and what the deploy gave the candidate (a candidate given 5 s must not cut production's
        load short), 900 s for a journal that records neither."""
        recorded = [t for t in (self.restore_timeout_s, self.health_timeout_s) if t is not None]
        return max(recorded) if recorded else 900.0

    @staticmethod
    def folder() -> Path:

        return state_dir() / "deploy"

    @classmethod
    def all(cls) -> list[Journal]:
        """Every deploy journal on this host (any definition): what holds a container name or a port."""
        try:
            paths = sorted(cls.folder().glob("*.json"))
        except OSError:
            return []
        return [j for p in paths if definition_name_ok(p.stem) and (j := cls.load(p.stem)) is not None]

    @classmethod
    def path_for(cls, definition: str) -> Path:
        if not definition_name_ok(definition):
            # The name becomes a file name in the state folder: nothing may lead out of it.
            raise ConfigError(f"{definition!r} is not an image definition name (lower-case letters, digits, "
                              "'.', '_', '-')", hint="name one of images/*.yaml without the .yaml")
        return cls.folder() / f"{definition}.json"

    @property
    def path(self) -> Path:
        return self.path_for(self.definition)

    @classmethod
    def load(cls, definition: str) -> Journal | None:
        """The journal of `definition`, None when there is none; every field checked (JournalError naming it)."""
        path = cls.path_for(definition)
        journal = load_record(path, lambda data: cls.from_json(data, source=str(path)), what="the deploy journal",
                               hint=_HINT)
        if journal is not None and journal.definition != definition:
            # Saved again it would land under another definition's name (and take over its journal).
            _refuse(str(path), "definition", f"is {journal.definition!r}, but the file is the journal of {definition!r}")
        return journal

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Journal:
        return cls.from_json(data, source="the deploy journal")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "phase": self.phase.value}

    @classmethod
    def from_json(cls, data: Any, *, source: str) -> Journal:
        """The journal a JSON document describes, field by field: the right type in each, no unknown one."""
        if not isinstance(data, dict):
            _refuse(source, "", f"must be a JSON object, not {json_kind(data)}")
        known = {f.name: f for f in fields(cls)}
        for name in data:
            if name not in known:
                _refuse(source, name, f"is not a journal field (known: {', '.join(known)})")
        values: dict[str, Any] = {}
        for name, spec in known.items():
            if name not in data:
                if spec.default is MISSING:  # a field without a default (none has a default_factory)
                    _refuse(source, name, "is missing")
                continue
            value = data[name]
            if name == "phase":
                phases = {p.value: p for p in Phase}
                if value not in phases:
                    _refuse(source, name, f"must be one of {', '.join(phases)}, not {json_shown(value)}")
                value = phases[value]
            elif spec.type == "bool":
                if not isinstance(value, bool):
                    _refuse(source, name, f"must be true or false, not {json_shown(value)}")
            elif spec.type == "int | None":
                if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536):
                    _refuse(source, name, f"must be a port number (1-65535) or null, not {json_shown(value)}")
            elif spec.type == "float | None":
                if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                          or not math.isfinite(value) or value <= 0):
                    _refuse(source, name, f"must be a positive number of seconds or null, not {json_shown(value)}")
                value = None if value is None else float(value)
            elif spec.type == "str | None":
                if value is not None and (not isinstance(value, str) or not value):
                    _refuse(source, name, f"must be a non-empty string or null, not {json_shown(value)}")
            elif not isinstance(value, str) or (not value and name != "note"):
                _refuse(source, name, f"must be a non-empty string, not {json_shown(value)}")
            values[name] = value
        return validate(cls(**values), source)

    def save(self) -> Journal:
        save_record(self.path, self)
        return self

    def advance(self, phase: Phase, **changes: str | bool | int | float | None) -> Journal:
        """The journal moved to `phase` (with `changes`), written to disk before the step it announces."""
        return replace(self, phase=phase, **changes).save()  # type: ignore[arg-type]


_STARTED = re.compile(r"^\d{8}-\d{6}$")
_ID = re.compile(r"^[0-9a-f]{12,64}$")
_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]+$")
_RESTART = re.compile(r"^(no|always|unless-stopped|on-failure(:\d+)?)$")
MAX_WAIT_S = 7 * 24 * 3600.0  # no server takes a week to load: a larger wait is a typo (1e300 was accepted)


def validate(journal: Journal, source: str = "the deploy journal") -> Journal:
    """The journal as a whole, before anything acts on it: each value of its kind (a real time, container
    ids and names docker could have given, a restart policy docker takes, waits a server could need) and
    roles that cannot coincide (the parked production is never the candidate). A hand-edited journal that
    fails is refused, never acted on (seen: parked_id == candidate_id made --rollback stop the only server)."""
    if not definition_name_ok(journal.definition):
        _refuse(source, "definition", f"is not an image definition name: {journal.definition!r}")
    if not _STARTED.match(journal.started):
        _refuse(source, "started", f"must be a time as YYYYmmdd-HHMMSS (as vpatch writes it), not {journal.started!r}")
    try:
        datetime.strptime(journal.started, "%Y%m%d-%H%M%S")
    except ValueError:
        _refuse(source, "started", f"is no real time: {journal.started!r}")
    for name in ("container", "parked_name", "candidate_kept_as"):
        value = getattr(journal, name)
        if value is not None and not _NAME.match(value):
            _refuse(source, name, f"is not a container name docker accepts: {value!r}")
    for name in ("parked_id", "candidate_id"):
        value = getattr(journal, name)
        if value is not None and not _ID.match(value):
            _refuse(source, name, f"must be a container id (12 to 64 hex digits, as docker gives it), not {json_shown(value)}")
    if journal.parked_id and journal.candidate_id and (journal.parked_id.startswith(journal.candidate_id)
                                                       or journal.candidate_id.startswith(journal.parked_id)):
        _refuse(source, "candidate_id", f"names the parked production container ({journal.parked_id[:12]}): the "
                "candidate and the parked production are two containers")
    if journal.parked_restart is not None and not _RESTART.match(journal.parked_restart):
        _refuse(source, "parked_restart", "must be a restart policy docker takes (no, always, unless-stopped, "
                f"on-failure[:N]), not {journal.parked_restart!r}")
    for name in ("health_timeout_s", "restore_timeout_s"):
        value = getattr(journal, name)
        if value is not None and value > MAX_WAIT_S:
            _refuse(source, name, f"is {value:g} s, more than a week ({MAX_WAIT_S:.0f} s): no server takes that "
                    "long to load")
    if any(c.isspace() for c in journal.image) or any(c.isspace() for c in journal.model or ""):
        _refuse(source, "image" if any(c.isspace() for c in journal.image) else "model",
                "holds white space, which no image reference or served model name does")
    if journal.phase in (Phase.PARKING,) and journal.parked_id is None:
        _refuse(source, "parked_id", "is missing while the phase is parking (the id is written before the park)")
    return journal


def _refuse(source: str, field: str, message: str) -> NoReturn:
    where = f"field {field!r}" if field else "it"
    raise JournalError(f"the deploy journal {source} is unreadable: {where} {message}", hint=_HINT)
