"""The lines commands print, made in report/ from the core's results: what a person reads after each mode."""

from __future__ import annotations

from vpatch.deploy.prune import Pruned
from vpatch.probes.env import LockChange
from vpatch.report import deploy, export, lock_probes
from vpatch.tree.export import ExportResult


def test_prune_names_each_container_removed_and_kept_and_says_when_nothing_went() -> None:
    assert deploy.prune_lines(Pruned(removed=("vllm-tiny-parked-1",), kept=(("vllm-tiny-parked-2", "newest"),))) == [
        "removed vllm-tiny-parked-1", "kept    vllm-tiny-parked-2 (newest)"]
    # kept containers alone: nothing was pruned, and that is said after what stays
    assert deploy.prune_lines(Pruned(removed=(), kept=(("vllm-tiny-parked-2", "--rollback brings it back"),))) == [
        "kept    vllm-tiny-parked-2 (--rollback brings it back)", "nothing to prune"]


def test_export_lines_say_would_on_a_dry_run_and_why_a_file_was_written_afresh() -> None:
    result = ExportResult(unchanged=("0001-a.patch",), changed=("0002-b.patch",), added=("0003-c.patch",),
                          rewritten=("0002-b.patch",), unmarked=("0003-c.patch",))
    why = {"0002-b.patch": "hunk 1 counts 3 lines, has 2"}
    dry = export.export_lines(result, dry_run=True, unreadable=why)
    done = export.export_lines(result, dry_run=False, unreadable=why)
    assert dry[:2] == ["would change: 0002-b.patch",
                       "  did not parse (hunk 1 counts 3 lines, has 2); written afresh from its commit in the applied tree"]
    assert done[:2] == ["changed: 0002-b.patch",
                        "  it did not parse (hunk 1 counts 3 lines, has 2); written afresh from its commit in the applied tree"]
    assert dry[2] == "would add: 0003-c.patch" and dry[3].startswith("  note: a new patch, from a commit without a Vpatch-File")
    assert export.export_lines(ExportResult(unchanged=("0001-a.patch",)), dry_run=False, unreadable={}) == [
        "nothing to export: 1 patch(es) unchanged"]


def test_an_unchanged_lock_has_no_lines_so_the_command_says_unchanged() -> None:
    assert lock_probes.change_lines(LockChange(added=(), removed=(), moved=())) == []
    assert lock_probes.change_lines(LockChange(added=("b==2",), removed=("c==1",), moved=(("a", "1", "2"),))) == [
        "a 1 -> 2", "+ b==2", "- c==1"]
