"""vpatch update on toy upstreams: drop landed, refresh needed, one commit, stop/continue/abort, atomic under kill."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import KV_FIXED, PARSER_FIXED, PARSER_V1, Project, git
from conftest import vpatch_cli as run
from helpers import killat
from helpers.project import commit_all, release, state_of

from vpatch import update as core
from vpatch.config.project import Config
from vpatch.series.files import Series


@pytest.fixture
def three(project: Project) -> Project:
    """0001 (kv), 0002 (parser), 0003 (new module) on v1.0, committed in the project's own repository."""
    project.make_patch(1, "kv-skip-null", {"vllm/kv.py": KV_FIXED}, "Skip null blocks")
    project.make_patch(2, "parser-fix", {"vllm/parser.py": PARSER_FIXED}, "Fix the parser")
    project.make_patch(3, "new-module", {"vllm/extra.py": "EXTRA = 1\n"}, "Add an extra module",
                       trailers="Origin: vendor\nUpstream-PR: 123\nLast-Update: 2026-09-02")
    commit_all(project)
    return project


def v11_lands_kv_and_shifts_parser(project: Project) -> None:
    """v1.1: the kv fix verbatim, and five new lines at the top of the parser (0002 now applies with offsets)."""
    release(project, {"vllm/kv.py": KV_FIXED, "vllm/parser.py": "# header\n" * 5 + PARSER_V1}, "v1.1")


def test_update_drops_landed_refreshes_offsets_keeps_the_rest_in_one_commit(three: Project) -> None:
    v11_lands_kv_and_shifts_parser(three)
    before_head = git(three.root, "rev-parse", "HEAD").strip()
    code, out = run(three, "update", "--to", "v1.1")
    assert code == 0, out
    assert "drop" in out and "0001-kv-skip-null.patch" in out

    names = sorted(p.name for p in three.patches.iterdir())
    assert names == ["0002-parser-fix.patch", "0003-new-module.patch", "RETIRED.md"]
    # exactly one new commit, holding everything; the tree is clean
    assert git(three.root, "rev-list", f"{before_head}..HEAD").split() == [git(three.root, "rev-parse", "HEAD").strip()]
    assert git(three.root, "status", "--porcelain") == ""
    message = git(three.root, "log", "-1", "--format=%B")
    assert message.startswith("Update upstream pin v1.0 -> v1.1: drop 0001")
    assert "Dropped, landed upstream" in message and "- 0001-kv-skip-null.patch: Skip null blocks" in message
    assert "Applied-Upstream: v1.1" in message and "reverse-apply" in message
    assert "Refreshed, re-exported against v1.1:\n- 0002-parser-fix.patch" in message
    assert "Kept, unchanged:\n- 0003-new-module.patch" in message
    # the pin moved, with the commit; the rest of vpatch.yaml is as it was
    assert (three.root / "vpatch.yaml").read_text().startswith("upstream:\n  source: git\n")
    config = Config.load(three.root)
    assert config.pin.ref == "v1.1"
    assert config.pin.commit == git(three.upstream.path, "rev-parse", "v1.1").strip()
    # 0002 was refreshed: it now applies to v1.1 without offsets
    assert "@@ -22,7 +22,7 @@" in (three.patches / "0002-parser-fix.patch").read_text()
    retired = (three.patches / "RETIRED.md").read_text()
    assert "## 0001-kv-skip-null" in retired and "Applied-Upstream: v1.1" in retired
    assert f"git show {before_head[:12]}:patches/0001-kv-skip-null.patch" in retired
    # the refreshed series applies on the new pin
    assert run(three, "apply")[0] == 0


def test_comments_in_vpatch_yaml_survive_the_pin_move(three: Project) -> None:
    v11_lands_kv_and_shifts_parser(three)
    text = (three.root / "vpatch.yaml").read_text().replace("pin:\n", "# the production pin\npin:\n  # moved by vpatch update\n")
    (three.root / "vpatch.yaml").write_text(text)
    commit_all(three, "comments")
    assert run(three, "update", "--to", "v1.1")[0] == 0
    after = (three.root / "vpatch.yaml").read_text()
    sha = git(three.upstream.path, "rev-parse", "v1.1").strip()
    assert after == text.replace("  ref: v1.0\n", f"  ref: v1.1\n  commit: {sha}\n")


def test_retired_numbers_are_never_reused(three: Project) -> None:
    v11_lands_kv_and_shifts_parser(three)
    release(three, {"vllm/extra.py": "EXTRA = 1\n"}, "v1.2")  # 0003 lands too; 0003 is the highest number
    assert run(three, "update", "--to", "v1.2")[0] == 0
    series = Series.load(three.patches)
    assert [p.number for p in series] == [2] and series.retired == {1, 3}
    assert series.next_number() == 4
    three.make_patch(1, "reused", {"README": "x\n"}, "Reuse a number")
    code, out = run(three, "apply")
    assert code == 1 and "reuses number 0001, which RETIRED.md lists as retired" in out


def test_dry_run_prints_the_plan_and_changes_nothing(three: Project) -> None:
    v11_lands_kv_and_shifts_parser(three)
    before = state_of(three)
    code, out = run(three, "update", "--to", "v1.1", "--dry-run")
    assert code == 0, out
    assert "plan: pin v1.0" in out and "-> v1.1" in out
    assert "would drop" in out and "0001-kv-skip-null.patch" in out
    assert "would re-apply 0002-parser-fix.patch" in out
    assert "0002-parser" in out.split("plan:")[0], "the status table comes first"
    assert state_of(three) == before
    assert not (three.root / ".git" / "vpatch-update").exists()


def test_refuses_uncommitted_changes_in_the_series(three: Project) -> None:
    v11_lands_kv_and_shifts_parser(three)
    (three.patches / "0003-new-module.patch").write_text((three.patches / "0003-new-module.patch").read_text() + "\n")
    before = state_of(three)
    code, out = run(three, "update", "--to", "v1.1")
    assert code == 1 and "uncommitted changes in the series or the pin: patches/0003-new-module.patch" in out
    assert state_of(three) == before


def test_a_hand_edit_of_a_patch_file_survives_update_and_the_stale_tree_cannot_export_over_it(three: Project) -> None:
    tree = three.root / ".vpatch" / "tree"
    assert run(three, "apply")[0] == 0  # the applied tree on v1.0, before the edit
    path = three.patches / "0002-parser-fix.patch"
    path.write_text(path.read_text().replace("+line 20 fixed\n", "+line 20 fixed by hand\n"))
    v11_lands_kv_and_shifts_parser(three)
    # uncommitted, the edit stops the update by name
    code, out = run(three, "update", "--to", "v1.1")
    assert code == 1 and "patches/0002-parser-fix.patch" in out, out
    commit_all(three, "0002 edited by hand")
    code, out = run(three, "update", "--to", "v1.1")
    assert code == 0, out
    refreshed = path.read_text()
    assert "+line 20 fixed by hand\n" in refreshed and "@@ -22," in refreshed  # the edit, at its new offset
    # the applied tree is still the v1.0 one, with the old 0002: export must not put that back
    assert "line 20 fixed by hand" not in (tree / "vllm/parser.py").read_text()
    code, out = run(three, "export")
    assert code == 1 and "patches/0002-parser-fix.patch was changed since vpatch last wrote it" in out, out
    assert "patches/0001-kv-skip-null.patch was removed since vpatch last wrote it" in out
    assert path.read_text() == refreshed and not (three.patches / "0001-kv-skip-null.patch").exists()
    assert git(three.root, "status", "--porcelain") == ""
    # apply --force is the way on: the tree of the new pin with the edit
    assert run(three, "apply", "--force")[0] == 0
    assert "line 20 fixed by hand" in (tree / "vllm/parser.py").read_text()


def test_refuses_to_move_backwards_unless_allowed(three: Project) -> None:
    v11_lands_kv_and_shifts_parser(three)
    assert run(three, "update", "--to", "v1.1")[0] == 0
    code, out = run(three, "update", "--to", "v1.0", "--dry-run")
    assert code == 1 and "v1.0 is not newer than the pin v1.1" in out and "--allow-downgrade" in out
    code, out = run(three, "update", "--to", "v1.0", "--dry-run", "--allow-downgrade")
    assert code == 0, out


def test_no_commit_stages_the_change(three: Project) -> None:
    v11_lands_kv_and_shifts_parser(three)
    head = git(three.root, "rev-parse", "HEAD")
    code, out = run(three, "update", "--to", "v1.1", "--no-commit")
    assert code == 0, out
    assert "staged in the project, not committed" in out
    assert git(three.root, "rev-parse", "HEAD") == head
    staged = git(three.root, "diff", "--cached", "--name-status").splitlines()
    assert "D\tpatches/0001-kv-skip-null.patch" in staged and "A\tpatches/RETIRED.md" in staged
    assert "M\tvpatch.yaml" in staged
    assert git(three.root, "diff", "--name-only") == ""  # work tree and index agree


def test_all_landed_says_the_official_image_suffices(three: Project) -> None:
    release(three, {"vllm/kv.py": KV_FIXED, "vllm/parser.py": PARSER_FIXED, "vllm/extra.py": "EXTRA = 1\n"}, "v2.0")
    code, out = run(three, "update", "--to", "v2.0")
    assert code == 0, out
    assert "no local patch remains: the official vLLM v2.0 image now suffices" in out
    assert not list(three.patches.glob("*.patch"))
    message = git(three.root, "log", "-1", "--format=%B")
    assert "drop 0001, 0002, 0003" in message and "the official vLLM v2.0 image now suffices" in message


def test_a_probe_that_no_longer_validates_stops_the_update_and_changes_nothing(three: Project) -> None:
    v11_lands_kv_and_shifts_parser(three)
    (three.patches / "0003-new-module.patch").write_text(
        (three.patches / "0003-new-module.patch").read_text().replace("Upstream-PR: 123", "Upstream-PR: 123\nProbe: probes/extra.yaml"))
    # a probe that validates on the pin (extra.py is missing there, the patch adds it); the validator below says it
    # does not on v1.1
    (three.patches / "probes").mkdir(exist_ok=True)
    (three.patches / "probes" / "extra.py").write_text(
        "import pathlib, sys\nsys.exit(0 if pathlib.Path('vllm/extra.py').is_file() else 1)\n")
    (three.patches / "probes" / "extra.yaml").write_text(
        'kind: command\nrun: ["{python}", "{probe_dir}/extra.py"]\nrequirements: []\n')
    commit_all(three, "probe for 0003")
    before = state_of(three)
    seen: list[tuple[str, str, str]] = []

    def validator(repo: Path, config: Config, patch, base: str, patched: str) -> core.Revalidation:  # type: ignore[no-untyped-def]
        seen.append((patch.filename, base, patched))
        return core.Revalidation(patch.filename, "probes/extra.yaml", False, "passes without the patch")

    with pytest.raises(core.VpatchError, match=r"0003-new-module\.patch: its probe no longer validates on v1\.1"):
        core.update(Config.load(three.root), "v1.1", validator=validator)
    assert [s[0] for s in seen] == ["0003-new-module.patch"]
    assert seen[0][1] == git(three.upstream.path, "rev-parse", "v1.1").strip()
    assert state_of(three) == before
    assert not (three.root / ".git" / "vpatch-update").exists()


# --- conflicts: stop, --abort, --continue ------------------------------------------------------


def conflicting_v11(project: Project) -> None:
    """v1.1 lands the kv fix and rewrites parser line 20 differently: 0002 conflicts."""
    release(project, {"vllm/kv.py": KV_FIXED, "vllm/parser.py": PARSER_V1.replace("line 20\n", "line twenty\n")}, "v1.1")


def test_conflict_stops_and_abort_restores_exactly(three: Project) -> None:
    conflicting_v11(three)
    before = state_of(three)
    code, out = run(three, "update", "--to", "v1.1")
    assert code == 5, out
    assert "stopped at 0002-parser-fix.patch" in out and "vpatch update --continue" in out
    tree = three.root / ".git" / "vpatch-update" / "tree"
    assert "<<<<<<<" in (tree / "vllm/parser.py").read_text()
    assert (three.root / ".git" / "vpatch-update" / "state.json").is_file()
    assert state_of(three) == before  # the project itself is untouched while stopped
    code, out = run(three, "update", "--to", "v1.1")
    assert code == 1 and "an update is in progress: update to v1.1 stopped at 0002-parser-fix.patch" in out

    code, out = run(three, "update", "--abort")
    assert code == 0, out
    assert state_of(three) == before
    assert not (three.root / ".git" / "vpatch-update").exists()
    assert "vpatch-update" not in git(three.upstream.path, "worktree", "list")


def test_continue_after_resolution_finishes_the_update(three: Project) -> None:
    conflicting_v11(three)
    assert run(three, "update", "--to", "v1.1")[0] == 5
    tree = three.root / ".git" / "vpatch-update" / "tree"
    code, out = run(three, "update", "--continue")
    assert code == 5 and "still have conflicts: vllm/parser.py" in out
    (tree / "vllm/parser.py").write_text(PARSER_V1.replace("line 20\n", "line twenty fixed\n"))
    git(tree, "add", "vllm/parser.py")
    code, out = run(three, "update", "--continue")
    assert code == 0, out
    assert "committed" in out
    assert sorted(p.name for p in three.patches.iterdir()) == ["0002-parser-fix.patch", "0003-new-module.patch", "RETIRED.md"]
    text = (three.patches / "0002-parser-fix.patch").read_text()
    assert "-line twenty\n+line twenty fixed\n" in text and "Subject: Fix the parser" in text
    assert "Vpatch-File" not in text
    assert Config.load(three.root).pin.ref == "v1.1"
    assert git(three.root, "status", "--porcelain") == ""
    assert not (three.root / ".git" / "vpatch-update").exists()
    assert run(three, "apply")[0] == 0


# --- interrupts: kill -9 at every step ---------------------------------------------------------


def vpatch_process(project: Project, *args: str, kill_at: str | None = None) -> subprocess.CompletedProcess[str]:
    """vpatch in a process of its own; `kill_at`: killed with SIGKILL at that step (helpers/killat.py)."""
    command = [sys.executable, str(killat.HERE), kill_at] if kill_at else [sys.executable, "-m", "vpatch"]
    return subprocess.run([*command, "--project", str(project.root), *args], capture_output=True, text=True)


def test_an_update_passes_each_kill_step_once_in_order(three: Project, tmp_path: Path) -> None:
    v11_lands_kv_and_shifts_parser(three)
    log = tmp_path / "steps"
    proc = subprocess.run([sys.executable, str(killat.HERE), "--trace", str(log), "--project", str(three.root),
                           "update", "--to", "v1.1"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert log.read_text().split() == list(killat.STEPS)


@pytest.mark.parametrize("step", [s for s in killat.STEPS if s != "committed"])
def test_kill_at_each_step_leaves_the_project_unchanged(three: Project, step: str) -> None:
    v11_lands_kv_and_shifts_parser(three)
    before = state_of(three)
    proc = vpatch_process(three, "update", "--to", "v1.1", kill_at=step)
    assert proc.returncode == -9, proc.stdout + proc.stderr
    assert state_of(three) == before
    # the leftovers of the killed run block nothing: the update runs through afterwards
    proc = vpatch_process(three, "update", "--to", "v1.1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert Config.load(three.root).pin.ref == "v1.1"
    assert "vpatch-update" not in git(three.upstream.path, "worktree", "list")


def test_kill_right_after_the_commit_point_can_be_undone_or_finished(three: Project) -> None:
    v11_lands_kv_and_shifts_parser(three)
    before = state_of(three)
    proc = vpatch_process(three, "update", "--to", "v1.1", kill_at="committed")
    assert proc.returncode == -9
    proc = vpatch_process(three, "update", "--to", "v1.1")
    assert proc.returncode == 1 and "interrupted while committing" in proc.stderr
    assert vpatch_process(three, "update", "--abort").returncode == 0
    assert state_of(three) == before

    proc = vpatch_process(three, "update", "--to", "v1.1", kill_at="committed")
    assert proc.returncode == -9
    proc = vpatch_process(three, "update", "--continue")
    assert proc.returncode == 0, proc.stderr
    assert git(three.root, "status", "--porcelain") == ""
    assert Config.load(three.root).pin.ref == "v1.1"
    assert not (three.patches / "0001-kv-skip-null.patch").exists()


def test_kill_during_a_continue_keeps_the_stopped_update(three: Project) -> None:
    conflicting_v11(three)
    before = state_of(three)
    assert vpatch_process(three, "update", "--to", "v1.1").returncode == 5
    tree = three.root / ".git" / "vpatch-update" / "tree"
    (tree / "vllm/parser.py").write_text(PARSER_V1.replace("line 20\n", "line twenty fixed\n"))
    git(tree, "add", "vllm/parser.py")
    assert vpatch_process(three, "update", "--continue", kill_at="exported").returncode == -9
    assert state_of(three) == before
    proc = vpatch_process(three, "update", "--continue")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "-line twenty\n+line twenty fixed\n" in (three.patches / "0002-parser-fix.patch").read_text()
    # the patches the killed --continue had committed are not applied (and exported) a second time
    assert sorted(p.name for p in three.patches.iterdir()) == ["0002-parser-fix.patch", "0003-new-module.patch", "RETIRED.md"]
