"""What a deploy measured, kept beside its journal: the checks, figures and time series of both sides.

One file per deploy (state folder: deploy/records/NAME-STARTED.json), written after the baseline and after
each check of the candidate, so a deploy killed with -9 still leaves what it measured (`vpatch deploy NAME
--report` renders it). The journal says where a switch stands; this says what was seen. A deployed record is
also the baseline of the next deploy of the same image id and suite: production is not measured again.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from vpatch.base import JournalError, load_record, save_record
from vpatch.config import Suite
from vpatch.deploy.journal import Journal
from vpatch.deploy.judge import CheckResult, CheckStatus, Figures
from vpatch.deploy.ledger import StartLedger
from vpatch.deploy.series import PassSeries

_HINT = "the deploy's record is only read for its report and as a later baseline: move it away to measure afresh"


class Source:
    """Where a baseline's figures come from."""

    MEASURED = "measured"  # the suite ran against production just now
    RECORDED = "recorded"  # the figures recorded when the running image was deployed (same image id, same suite)
    NONE = "none"  # no baseline (a first deploy, or --baseline none)


@dataclass(frozen=True)
class Side:
    """One server's pass: its checks in order, its figures, its samples; for a baseline, where it came from."""

    checks: tuple[CheckResult, ...]
    figures: Figures
    series: PassSeries
    source: str = Source.MEASURED
    recorded_at: str | None = None  # a recorded baseline: when the deploy that measured it finished (ISO)
    image_id: str | None = None
    ledger: StartLedger = field(default_factory=StartLedger)  # what its start cost, from its own log

    def to_dict(self) -> dict[str, Any]:
        return {"checks": [check_json(c) for c in self.checks], "figures": asdict(self.figures),
                "series": self.series.to_json(), "source": self.source, "recorded_at": self.recorded_at,
                "image_id": self.image_id, "ledger": self.ledger.to_json()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Side:
        known = {f.name for f in fields(Figures)}
        return cls(
            checks=tuple(check_from_json(c) for c in data["checks"]),
            figures=Figures(**{k: _tupled(v) for k, v in data["figures"].items() if k in known}),
            series=PassSeries.from_json(data["series"]), source=str(data.get("source", Source.MEASURED)),
            recorded_at=data.get("recorded_at"), image_id=data.get("image_id"),
            ledger=StartLedger.from_json(data.get("ledger")))


def _tupled(value: Any) -> Any:
    """A figure as read back: JSON's lists are the timing check's sample tuples."""
    return tuple(value) if isinstance(value, list) else value


def check_json(c: CheckResult) -> dict[str, Any]:
    return {"name": c.name, "status": c.status.value, "figure": c.figure, "detail": c.detail,
            "seconds": round(c.seconds, 2)}


def check_from_json(data: dict[str, Any]) -> CheckResult:
    return CheckResult(str(data["name"]), CheckStatus(data["status"]), str(data["figure"]), str(data.get("detail", "")),
                       float(data.get("seconds", 0.0)))


@dataclass(frozen=True)
class DeployRecord:
    definition: str
    container: str
    image: str
    started: str  # the journal's stamp: the record of the deploy that journal describes
    suite_key: str
    baseline: Side | None = None
    candidate: Side | None = None
    decision: str | None = None  # None while the deploy runs (or after a kill -9)
    failed_check: str | None = None
    rollback: str = ""  # one sentence: what state production is in
    steps: tuple[tuple[str, float], ...] = ()
    finished: str | None = None  # ISO time

    @staticmethod
    def folder() -> Path:
        return Journal.folder() / "records"

    @classmethod
    def path_for(cls, definition: str, started: str) -> Path:
        Journal.path_for(definition)  # the same name check: nothing leads out of the state folder
        return cls.folder() / f"{definition}-{started}.json"

    @property
    def path(self) -> Path:
        return self.path_for(self.definition, self.started)

    @property
    def html_path(self) -> Path:
        """Where the deploy's HTML report is written: beside the records, one per deploy."""
        return Journal.folder() / "reports" / f"{self.definition}-{self.started}.html"

    def save(self) -> DeployRecord:
        save_record(self.path, self)
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"definition": self.definition, "container": self.container, "image": self.image,
                "started": self.started, "suite_key": self.suite_key,
                "baseline": self.baseline.to_dict() if self.baseline else None,
                "candidate": self.candidate.to_dict() if self.candidate else None,
                "decision": self.decision, "failed_check": self.failed_check, "rollback": self.rollback,
                "steps": [[name, round(seconds, 2)] for name, seconds in self.steps], "finished": self.finished}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeployRecord:
        return cls(
            definition=str(data["definition"]), container=str(data["container"]), image=str(data["image"]),
            started=str(data["started"]), suite_key=str(data["suite_key"]),
            baseline=Side.from_dict(data["baseline"]) if data.get("baseline") else None,
            candidate=Side.from_dict(data["candidate"]) if data.get("candidate") else None,
            decision=data.get("decision"), failed_check=data.get("failed_check"), rollback=str(data.get("rollback", "")),
            steps=tuple((str(n), float(s)) for n, s in data.get("steps", [])), finished=data.get("finished"))

    @classmethod
    def load(cls, path: Path) -> DeployRecord | None:
        return load_record(path, cls.from_dict, what="the deploy record", hint=_HINT)

    @classmethod
    def latest(cls, definition: str) -> DeployRecord | None:
        """The record of the last deploy of `definition` (the journal's, else the newest file)."""
        journal = Journal.load(definition)
        if journal is not None:
            found = cls.load(cls.path_for(definition, journal.started))
            if found is not None:
                return found
        for path in cls.of(definition):
            return cls.load(path)
        return None

    @classmethod
    def of(cls, definition: str) -> list[Path]:
        """The record files of `definition`, newest first (the stamp sorts by time)."""
        Journal.path_for(definition)
        # NAME-YYYYmmdd-HHMMSS.json exactly: "tiny-2-..." is not a record of "tiny".
        stamp = re.compile(rf"{re.escape(definition)}-\d{{8}}-\d{{6}}\.json")
        return sorted((p for p in cls.folder().glob(f"{definition}-*.json") if stamp.fullmatch(p.name)), reverse=True)


def suite_key(suite: Suite) -> str:
    """What makes two passes comparable: the checks and their thresholds (hooks and timeouts do not count)."""
    checks: tuple[object, ...] = (suite.kv_pool, suite.block_cost, suite.needles, suite.tool_call, suite.questions, suite.parallel,
              suite.ceiling, suite.memory, suite.log_patterns)
    if suite.timing is not None:  # added only when set: the keys of suites recorded before it stay the same
        checks += (suite.timing,)
    return hashlib.sha256(repr(checks).encode()).hexdigest()[:16]


def recorded_baseline(definition: str, image_id: str, key: str) -> Side | None:
    """The candidate side of the newest deployed record of `definition` for image `image_id` and suite `key`:
    what production measured when it was deployed. An unreadable record is passed over (it is no baseline)."""
    for path in DeployRecord.of(definition):
        try:
            found = DeployRecord.load(path)
        except JournalError:
            continue
        if (found is None or found.decision != "deployed" or found.candidate is None
                or found.candidate.image_id != image_id or found.suite_key != key):
            continue
        side = found.candidate
        return Side(side.checks, side.figures, side.series, Source.RECORDED, found.finished or found.started, image_id,
                    side.ledger)
    return None


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def age(recorded_at: str | None, now: datetime | None = None) -> str:
    """'3 h 12 min ago' for an ISO time; '' when unknown."""
    if not recorded_at:
        return ""
    try:
        then = datetime.fromisoformat(recorded_at)
    except ValueError:
        return ""
    seconds = max(0, int(((now or datetime.now(UTC)) - then).total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    if days:
        return f"{days} d {hours} h ago"
    if hours:
        return f"{hours} h {minutes} min ago"
    return f"{minutes} min ago" if minutes else f"{seconds} s ago"
