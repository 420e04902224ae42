"""Switch production to a new image with checks: park/start/rollback, the check suite, the journal, the report.

Other rooms import these names from here; modules inside the room import each other directly."""

from vpatch.deploy.container import stamp
from vpatch.deploy.journal import Journal
from vpatch.deploy.judge import CheckResult, Figures
from vpatch.deploy.ledger import FIELDS as LEDGER_FIELDS
from vpatch.deploy.ledger import LedgerRow, StartLedger, absent_note, ledger_rows, shown_per_worker
from vpatch.deploy.noise import Call, compare, load_moved, rule, spread
from vpatch.deploy.record import DeployRecord, Side, Source, age
from vpatch.deploy.series import PassSeries
from vpatch.deploy.switch import Report, Where, holders

__all__ = [
    "LEDGER_FIELDS",
    "Call",
    "CheckResult",
    "DeployRecord",
    "Figures",
    "Journal",
    "LedgerRow",
    "PassSeries",
    "Report",
    "Side",
    "Source",
    "StartLedger",
    "Where",
    "absent_note",
    "age",
    "compare",
    "holders",
    "ledger_rows",
    "load_moved",
    "rule",
    "shown_per_worker",
    "spread",
    "stamp",
]
