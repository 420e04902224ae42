"""Switch production to a new image with checks: park/start/rollback, the check suite, the journal, the report.

Other rooms import these names from here; modules inside the room import each other directly."""

from vpatch.deploy.container import Restored, stamp
from vpatch.deploy.fleet import FleetReport, HostDeploy, deploy_fleet
from vpatch.deploy.journal import Journal
from vpatch.deploy.judge import CheckResult, Figures
from vpatch.deploy.ledger import FIELDS as LEDGER_FIELDS
from vpatch.deploy.ledger import LedgerRow, StartLedger, absent_note, ledger_rows, shown_per_worker
from vpatch.deploy.live import LivePlan, LiveReport, live_json, plan_live, verify_live
from vpatch.deploy.noise import FLOOR_S, Call, compare, load_moved, rule, spread, stall_moved
from vpatch.deploy.prune import Pruned, prune_containers
from vpatch.deploy.record import DeployRecord, Side, Source, age
from vpatch.deploy.series import PassSeries
from vpatch.deploy.switch import BaselineMode, Report, Where, deploy, describe, holders, rollback, where

__all__ = [
    "FLOOR_S",
    "LEDGER_FIELDS",
    "BaselineMode",
    "Call",
    "CheckResult",
    "DeployRecord",
    "Figures",
    "FleetReport",
    "HostDeploy",
    "Journal",
    "LedgerRow",
    "LivePlan",
    "LiveReport",
    "PassSeries",
    "Pruned",
    "Report",
    "Restored",
    "Side",
    "Source",
    "StartLedger",
    "Where",
    "absent_note",
    "age",
    "compare",
    "deploy",
    "deploy_fleet",
    "describe",
    "holders",
    "ledger_rows",
    "live_json",
    "load_moved",
    "plan_live",
    "prune_containers",
    "rollback",
    "rule",
    "shown_per_worker",
    "spread",
    "stall_moved",
    "stamp",
    "verify_live",
    "where",
]
