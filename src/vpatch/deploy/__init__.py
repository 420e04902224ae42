"""Switch production to a new image with checks: park/start/rollback, the check suite, the journal, the report.

Other rooms import these names from here; modules inside the room import each other directly."""

from vpatch.deploy.checks import Figures
from vpatch.deploy.container import stamp
from vpatch.deploy.journal import Journal
from vpatch.deploy.record import DeployRecord, Side, Source, age
from vpatch.deploy.series import Series
from vpatch.deploy.switch import Report, Where, holders

__all__ = [
    "DeployRecord",
    "Figures",
    "Journal",
    "Report",
    "Series",
    "Side",
    "Source",
    "Where",
    "age",
    "holders",
    "stamp",
]
