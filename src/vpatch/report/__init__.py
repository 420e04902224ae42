"""How results are shown: tables, lines and JSON for the CLI to print. Nothing here prints.

Other rooms import these names from here; modules inside the room import each other directly. The pages of a
deploy (deploy.py, deploy_html.py: the deploy room, 102 modules with matplotlib's) and of status and update
(status.py, update.py: those rooms) load when first used (`_LAZY`), not with the face: every command that shows
progress imports the face."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vpatch.base import lazy_exports
from vpatch.report.apply import applied_lines, moved_pin_warning
from vpatch.report.build import built_lines
from vpatch.report.console import ProgressView
from vpatch.report.export import export_lines
from vpatch.report.lock_probes import change_lines
from vpatch.report.new import started_lines
from vpatch.report.probe import checked_lines, coverage_lines, dirty_warning, regression_lines, tree_lines, written_lines
from vpatch.report.releases import release_lines
from vpatch.report.serve import container_check_line, drift_json, drift_lines, fleet_drift_json, fleet_drift_lines, served_lines
from vpatch.report.verify import check_lines, live_lines, live_summary, matched_line

if TYPE_CHECKING:
    from vpatch.report.deploy import fleet_json as fleet_deploy_json
    from vpatch.report.deploy import fleet_lines as fleet_deploy_lines
    from vpatch.report.deploy import lines as deploy_lines
    from vpatch.report.deploy import page_line, prune_lines, rolled_back_line
    from vpatch.report.deploy import plan_notes as live_plan_notes
    from vpatch.report.deploy import status_lines as deploy_status_lines
    from vpatch.report.deploy import tables as deploy_tables
    from vpatch.report.deploy import to_json as deploy_json
    from vpatch.report.deploy_html import live_page
    from vpatch.report.deploy_html import render as deploy_page
    from vpatch.report.forward import forward_json, forward_lines, recorded_line
    from vpatch.report.status import status_json, status_table
    from vpatch.report.update import furthest_lines, update_json, update_lines
    from vpatch.report.update import plan_table as update_plan_table

# name -> (module, name there): loaded on first use (PEP 562); tests/project/test_architecture.py checks each entry
# against the TYPE_CHECKING imports above (what mypy reads) and that the face loads none of them.
_LAZY: dict[str, tuple[str, str]] = {
    "deploy_json": ("vpatch.report.deploy", "to_json"),
    "deploy_lines": ("vpatch.report.deploy", "lines"),
    "deploy_page": ("vpatch.report.deploy_html", "render"),
    "deploy_status_lines": ("vpatch.report.deploy", "status_lines"),
    "deploy_tables": ("vpatch.report.deploy", "tables"),
    "fleet_deploy_json": ("vpatch.report.deploy", "fleet_json"),
    "fleet_deploy_lines": ("vpatch.report.deploy", "fleet_lines"),
    "forward_json": ("vpatch.report.forward", "forward_json"),
    "forward_lines": ("vpatch.report.forward", "forward_lines"),
    "furthest_lines": ("vpatch.report.update", "furthest_lines"),
    "live_page": ("vpatch.report.deploy_html", "live_page"),
    "live_plan_notes": ("vpatch.report.deploy", "plan_notes"),
    "page_line": ("vpatch.report.deploy", "page_line"),
    "prune_lines": ("vpatch.report.deploy", "prune_lines"),
    "recorded_line": ("vpatch.report.forward", "recorded_line"),
    "rolled_back_line": ("vpatch.report.deploy", "rolled_back_line"),
    "status_json": ("vpatch.report.status", "status_json"),
    "status_table": ("vpatch.report.status", "status_table"),
    "update_json": ("vpatch.report.update", "update_json"),
    "update_lines": ("vpatch.report.update", "update_lines"),
    "update_plan_table": ("vpatch.report.update", "plan_table"),
}

if not TYPE_CHECKING:  # mypy reads the names from the imports above, not from a catch-all
    __getattr__ = lazy_exports(globals(), _LAZY)

__all__ = [
    "ProgressView",
    "applied_lines",
    "built_lines",
    "change_lines",
    "check_lines",
    "checked_lines",
    "container_check_line",
    "coverage_lines",
    "deploy_json",
    "deploy_lines",
    "deploy_page",
    "deploy_status_lines",
    "deploy_tables",
    "dirty_warning",
    "drift_json",
    "drift_lines",
    "export_lines",
    "fleet_deploy_json",
    "fleet_deploy_lines",
    "fleet_drift_json",
    "fleet_drift_lines",
    "forward_json",
    "forward_lines",
    "furthest_lines",
    "live_lines",
    "live_page",
    "live_plan_notes",
    "live_summary",
    "matched_line",
    "moved_pin_warning",
    "page_line",
    "prune_lines",
    "recorded_line",
    "regression_lines",
    "release_lines",
    "rolled_back_line",
    "served_lines",
    "started_lines",
    "status_json",
    "status_table",
    "tree_lines",
    "update_json",
    "update_lines",
    "update_plan_table",
    "written_lines",
]
