"""A stopped update on toy upstreams: every command knows it, impossible flags are refused, and nothing a person
writes during the stop is lost (a hand edit of patches/ or a commit taken in, a resolution kept by --abort and
replayed by the next update). tests/update/test_update_releases.py walks the same on the real history."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest
from conftest import KV_FIXED, PARSER_FIXED, PARSER_V1, Project, git
from conftest import vpatch_cli as run
from helpers.project import commit_all, release, state_of

from vpatch.config.project import Config

RESOLVED = PARSER_V1.replace("line 20\n", "line twenty fixed\n")
KV_PROBE = "kind: files\nfiles:\n  vllm/kv.py:\n    contains: [\"continue\"]\n    not_contains: [\"break\"]\n"


@pytest.fixture
def stopped(project: Project) -> Project:
    """0001 (kv, with a files probe and a script beside it), 0002 (parser) on v1.0; v1.1 lands 0001 and rewrites
    parser line 20 differently: `update --to v1.1` drops 0001 and stops at 0002."""
    project.make_patch(1, "kv-skip-null", {"vllm/kv.py": KV_FIXED}, "Skip null blocks",
                       trailers="Origin: vendor\nProbe: probes/0001-kv-skip-null.yaml\nLast-Update: 2026-09-01")
    project.make_patch(2, "parser-fix", {"vllm/parser.py": PARSER_FIXED}, "Fix the parser")
    (project.patches / "probes").mkdir()
    (project.patches / "probes" / "0001-kv-skip-null.yaml").write_text(KV_PROBE)
    (project.patches / "probes" / "0001-kv-skip-null.notes").write_text("the probe's notes leave with it\n")
    (project.patches / "probes" / "shared.lock").write_text("shared by every probe: stays\n")
    commit_all(project)
    release(project, {"vllm/kv.py": KV_FIXED, "vllm/parser.py": PARSER_V1.replace("line 20\n", "line twenty\n")},
            "v1.1")
    code, out = run(project, "update", "--to", "v1.1")
    assert code == 5, out
    return project


def tree_of(project: Project) -> Path:
    return project.root / ".git" / "vpatch-update" / "tree"


def resolve_in_tree(project: Project) -> None:
    (tree_of(project) / "vllm/parser.py").write_text(RESOLVED)
    git(tree_of(project), "add", "vllm/parser.py")


def test_the_stop_shows_upstreams_side_and_labelled_markers(stopped: Project) -> None:
    text = (tree_of(stopped) / "vllm/parser.py").read_text()
    assert "<<<<<<< v1.1 (upstream, with the patches before it)\n" in text
    assert ">>>>>>> 0002-parser-fix.patch\n" in text
    assert "<<<<<<< ours" not in text and ">>>>>>> theirs" not in text
    v11 = git(stopped.upstream.path, "rev-parse", "v1.1").strip()
    code, out = run(stopped, "update", "--abort")
    assert code == 0
    code, out = run(stopped, "update", "--to", "v1.1")
    assert code == 5
    # the one upstream commit that changed those lines between the pin and the target, by id and subject
    assert f"upstream changed these lines between v1.0 and v1.1: {v11[:12]} " in out, out


def test_every_command_knows_the_stop(stopped: Project) -> None:
    line = ("update to v1.1 stopped at 0002-parser-fix.patch (conflict in vllm/parser.py): resolve in "
            f"{tree_of(stopped)}, then `vpatch update --continue` (or `--abort`)")
    code, out = run(stopped, "update")
    assert code == 5 and line in out, out
    assert json.loads(run(stopped, "update", "--json")[1])["stopped_update"]["file"] == "0002-parser-fix.patch"
    code, out = run(stopped, "status", "--no-probes")
    assert code == 0 and line in out, out
    doc = json.loads(run(stopped, "status", "--no-probes", "--json")[1])
    assert doc["stopped_update"]["to"] == "v1.1" and doc["stopped_update"]["line"] == line
    for args in (["apply"], ["export", "--dry-run"], ["new", "more-logs", "--subject", "log more"],
                 ["probe", "check", "2"]):
        out = run(stopped, *args)[1]
        assert f"note: {line}" in out, (args, out)


def test_impossible_flags_are_refused_and_the_stop_stays(stopped: Project) -> None:
    before = (stopped.root / ".git" / "vpatch-update" / "state.json").read_bytes()
    for args in (["--abort", "--dry-run"], ["--continue", "--dry-run"], ["--continue", "--no-commit"],
                 ["--abort", "--to", "v1.1"], ["--continue", "--abort"], ["--abort", "--furthest"]):
        code, out = run(stopped, "update", *args)
        assert code == 2, (args, out)
        assert "error:" in out and "hint:" in out
    assert (stopped.root / ".git" / "vpatch-update" / "state.json").read_bytes() == before
    assert "<<<<<<<" in (tree_of(stopped) / "vllm/parser.py").read_text()  # nothing aborted
    code, out = run(stopped, "update", "--dry-run")
    assert code == 2 and "need --to REF" in out and "v0." not in out  # no made-up release below the pin


def test_a_dry_run_that_would_stop_exits_as_the_real_run(stopped: Project) -> None:
    assert run(stopped, "update", "--abort")[0] == 0
    code, out = run(stopped, "update", "--to", "v1.1", "--dry-run")
    assert code == 5, out
    assert "would stop at" in out


def test_abort_of_an_untouched_stop_keeps_nothing(stopped: Project) -> None:
    code, out = run(stopped, "update", "--abort")
    assert code == 0 and "kept" not in out, out
    assert not (stopped.root / ".git" / "vpatch-resolutions").exists()


def test_abort_keeps_the_resolution_and_the_next_update_replays_it(stopped: Project) -> None:
    resolve_in_tree(stopped)
    before = state_of(stopped)
    code, out = run(stopped, "update", "--abort")
    assert code == 0, out
    assert state_of(stopped) == before  # the project as it was
    kept = stopped.root / ".git" / "vpatch-resolutions" / "0002-parser-fix"
    assert f"your resolution of 0002-parser-fix.patch (vllm/parser.py) is kept in {kept}" in out, out
    assert (kept / "files" / "vllm/parser.py").read_text() == RESOLVED
    assert "+line twenty fixed" in (kept / "resolution.diff").read_text()

    code, out = run(stopped, "update", "--to", "v1.1")
    assert code == 5, out
    assert "replayed your resolution of 0002-parser-fix.patch" in out and "as git rerere" in out
    assert (tree_of(stopped) / "vllm/parser.py").read_text() == RESOLVED
    assert "resolution replayed" in run(stopped, "update")[1]
    code, out = run(stopped, "update", "--continue")
    assert code == 0, out
    text = (stopped.patches / "0002-parser-fix.patch").read_text()
    assert "+line twenty fixed" in text
    assert "Rewritten: by hand for v1.1 (conflict in vllm/parser.py)\n" in text
    assert f"Last-Update: {datetime.date.today().isoformat()}" in text
    message = git(stopped.root, "log", "-1", "--format=%B")
    assert "Rewritten by hand for v1.1" in message and "- 0002-parser-fix.patch: Rewritten: by hand for v1.1" in message
    assert "Evidence: applies on v1.1 (no probe)" in message
    assert not kept.exists()  # in the project's commit now


def test_the_same_conflict_at_a_later_target_is_replayed_and_says_so(stopped: Project) -> None:
    resolve_in_tree(stopped)
    assert run(stopped, "update", "--abort")[0] == 0
    # v1.2 keeps v1.1's parser line and changes another file: the conflict is the same
    release(stopped, {"vllm/other.py": "x = 1\n"}, "v1.2")
    code, out = run(stopped, "update", "--to", "v1.2")
    assert code == 5, out
    assert "replayed your resolution of 0002-parser-fix.patch" in out and "since an update to v1.1" in out, out
    assert (tree_of(stopped) / "vllm/parser.py").read_text() == RESOLVED
    code, out = run(stopped, "update", "--continue")
    assert code == 0, out
    assert "Rewritten: by hand for v1.2" in (stopped.patches / "0002-parser-fix.patch").read_text()
    assert Config.load(stopped.root).pin.ref == "v1.2"


def test_a_kept_resolution_that_no_longer_applies_leaves_the_conflict_and_stays_kept(stopped: Project) -> None:
    resolve_in_tree(stopped)
    assert run(stopped, "update", "--abort")[0] == 0
    kept = stopped.root / ".git" / "vpatch-resolutions" / "0002-parser-fix"
    # v1.2 rewrites the same line again: the resolution made for v1.1 does not apply there
    release(stopped, {"vllm/parser.py": PARSER_V1.replace("line 20\n", "line XX\n")}, "v1.2")
    code, out = run(stopped, "update", "--to", "v1.2")
    assert code == 5, out
    assert "replayed" not in out, out
    assert f"kept in {kept} since an update to v1.1, does not apply on v1.2 as it is" in " ".join(out.split()), out
    text = (tree_of(stopped) / "vllm/parser.py").read_text()
    assert "<<<<<<< " in text and ">>>>>>> 0002-parser-fix.patch" in text and "line XX" in text, text
    assert (kept / "files" / "vllm/parser.py").read_text() == RESOLVED  # nothing lost
    assert run(stopped, "update", "--abort")[0] == 0
    assert (kept / "files" / "vllm/parser.py").read_text() == RESOLVED


def test_a_hand_edit_of_patches_committed_during_the_stop_is_taken_in(stopped: Project) -> None:
    # the person writes the patch as it must be on v1.1 in patches/ (not in the update tree) and commits it
    patch = stopped.patches / "0002-parser-fix.patch"
    patch.write_text(patch.read_text().replace("-line 20\n+line 20 fixed\n", "-line twenty\n+line twenty fixed\n"))
    code, out = run(stopped, "update", "--continue")
    assert code == 1 and "uncommitted changes in the series" in out and "takes a commit made during the stop in" in out
    assert (stopped.root / ".git" / "vpatch-update" / "state.json").is_file()  # refused, nothing lost
    mine = commit_all(stopped, "0002 rewritten for v1.1 by hand")
    code, out = run(stopped, "update", "--continue")
    assert code == 0, out
    assert "took in 1 commit(s) made during the stop" in out
    assert "took in patches/0002-parser-fix.patch as edited by hand: it applies on v1.1" in out
    assert git(stopped.root, "rev-parse", "HEAD~1").strip() == mine  # the update's commit goes on top of it
    text = patch.read_text()
    assert "+line twenty fixed" in text and "Rewritten: by hand for v1.1" in text
    assert Config.load(stopped.root).pin.ref == "v1.1"
    # the update tree held the conflict as the stop left it: nothing of a person's to set aside
    assert "set aside" not in out and not (stopped.root / ".git" / "vpatch-resolutions").exists()


def test_work_in_progress_in_the_tree_is_set_aside_when_a_hand_edit_of_patches_replaces_it(stopped: Project) -> None:
    # work begun in the tree, its conflict markers still there: no resolution; the hand edit is the one
    conflicted = tree_of(stopped) / "vllm/parser.py"
    conflicted.write_text(conflicted.read_text().replace("line 21\n", "line 21 half-way\n"))
    patch = stopped.patches / "0002-parser-fix.patch"
    patch.write_text(patch.read_text().replace("-line 20\n+line 20 fixed\n", "-line twenty\n+line twenty fixed\n"))
    commit_all(stopped, "0002 rewritten for v1.1 by hand")
    code, out = run(stopped, "update", "--continue")
    assert code == 0, out
    kept = stopped.root / ".git" / "vpatch-resolutions" / "0002-parser-fix"
    assert f"the update tree's work is set aside for the hand edit of patches/0002-parser-fix.patch: your work in " \
           f"progress (conflict markers left in it) of 0002-parser-fix.patch (vllm/parser.py) is kept in {kept}" in out, out
    assert "line 21 half-way" in (kept / "files" / "vllm/parser.py").read_text()
    assert "line 21 half-way" not in patch.read_text()  # the committed hand edit decided


def test_a_commit_changing_what_the_update_used_is_refused_with_the_resolution_kept(stopped: Project) -> None:
    resolve_in_tree(stopped)
    retired = stopped.patches / "0001-kv-skip-null.patch"
    retired.write_text(retired.read_text().replace("Skip null blocks", "Skip null blocks (edited)"))
    commit_all(stopped, "edit 0001 during the stop")
    code, out = run(stopped, "update", "--continue")
    assert code == 1 and "changes 0001-kv-skip-null.patch, which the update drops" in out, out
    assert (tree_of(stopped) / "vllm/parser.py").read_text() == RESOLVED  # the resolution is where it was
    code, out = run(stopped, "update", "--abort")
    assert code == 0 and "your resolution of 0002-parser-fix.patch" in out


def test_a_dropped_patch_takes_its_probe_files_along(stopped: Project) -> None:
    resolve_in_tree(stopped)
    code, out = run(stopped, "update", "--continue")
    assert code == 0, out
    probes = sorted(p.name for p in (stopped.patches / "probes").iterdir())
    assert probes == ["shared.lock"]
    message = git(stopped.root, "log", "-1", "--format=%B")
    assert "Probe files retired with their patches:\n- patches/probes/0001-kv-skip-null.notes\n" in message
    # one release in Applied-Upstream: the first that has it
    assert "Applied-Upstream: v1.1 (" in message and "release v1.1" not in message


SLOW_PROBE = """import pathlib, sys, time
started, slow = pathlib.Path({started!r}), pathlib.Path({slow!r})
if slow.exists():
    started.write_text("running")
    time.sleep(120)
sys.exit(0 if "fixed" in pathlib.Path("vllm/parser.py").read_text() else 1)
"""


def test_ctrl_c_during_continue_says_how_to_go_on(project: Project, tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    started, slow = tmp_path / "started", tmp_path / "slow"
    probes = project.patches / "probes"
    probes.mkdir()
    (probes / "parser.py").write_text(SLOW_PROBE.format(started=str(started), slow=str(slow)))
    (probes / "parser.yaml").write_text('kind: command\nrun: ["{python}", "{probe_dir}/parser.py"]\nrequirements: []\n')
    project.make_patch(2, "parser-fix", {"vllm/parser.py": PARSER_FIXED}, "Fix the parser",
                       trailers="Origin: vendor\nProbe: probes/parser.yaml\nLast-Update: 2026-09-01")
    commit_all(project)
    release(project, {"vllm/parser.py": PARSER_V1.replace("line 20\n", "line twenty\n")}, "v1.1")
    assert run(project, "update", "--to", "v1.1")[0] == 5
    resolve_in_tree(project)
    slow.write_text("")  # the probe the --continue runs now takes two minutes
    # started with SIGINT ignored, as a shell starts a background job (the cold CI run had it so): Ctrl-C must
    # still reach the update
    proc = subprocess.Popen([sys.executable, "-m", "vpatch", "--project", str(project.root), "update", "--continue"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    deadline = time.monotonic() + 120
    while not started.exists():
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()[0]
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)  # Ctrl-C
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    # the resolution was committed in the update tree before the probes ran: --continue goes on from there
    assert "error: interrupted; the update is kept where it was: update to v1.1 was interrupted during " \
           "`--continue`, its stops resolved: `vpatch update --continue` finishes it (or `--abort`)" in out, out
    assert "hint: vpatch update --continue again goes on from there" in out
    assert run(project, "update")[0] == 5  # still in progress
    slow.unlink()
    code, out = run(project, "update", "--continue")
    assert code == 0, out
    assert Config.load(project.root).pin.ref == "v1.1"


def name_the_bug(patch: Path) -> str:
    """What the stop's hint offers besides the tree: a word in the patch's header in patches/ (a vendor bug
    named above its trailers), the diff left as the update found it."""
    text = patch.read_text()
    edited = text.replace("\nOrigin: vendor", "\nVendor-Bug: PARSE-1234 (the parser drops line 20)\n\nOrigin: vendor", 1)
    assert edited != text
    patch.write_text(edited)
    return edited


def test_a_header_only_edit_of_patches_keeps_the_trees_resolution(stopped: Project) -> None:
    # the person resolves in the update tree and names the vendor bug in the patch's header, and commits that
    resolve_in_tree(stopped)
    patch = stopped.patches / "0002-parser-fix.patch"
    name_the_bug(patch)
    commit_all(stopped, "0002: name the vendor bug")
    code, out = run(stopped, "update", "--continue")
    assert code == 0, out  # one --continue: the resolution is not asked for again
    assert Config.load(stopped.root).pin.ref == "v1.1"
    text = patch.read_text()
    # the diff from the tree, the header from the file
    assert "+line twenty fixed" in text and "+line 20 fixed" not in text, text
    assert "Vendor-Bug: PARSE-1234 (the parser drops line 20)" in text
    assert "Rewritten: by hand for v1.1 (conflict in vllm/parser.py)" in text
    assert "header of patches/0002-parser-fix.patch as edited by hand" in out, out
    assert not (stopped.root / ".git" / "vpatch-resolutions").exists()  # nothing set aside: both kept


def test_a_header_only_edit_with_the_conflict_unresolved_says_so_and_keeps_the_edit(stopped: Project) -> None:
    name_the_bug(stopped.patches / "0002-parser-fix.patch")
    commit_all(stopped, "0002: name the vendor bug")
    code, out = run(stopped, "update", "--continue")
    assert code == 5 and "still have conflicts: vllm/parser.py" in out, out
    resolve_in_tree(stopped)
    code, out = run(stopped, "update", "--continue")
    assert code == 0, out
    text = (stopped.patches / "0002-parser-fix.patch").read_text()
    assert "+line twenty fixed" in text and "Vendor-Bug: PARSE-1234" in text


def test_a_hand_edit_changing_the_diff_and_a_different_tree_resolution_stop_naming_both(stopped: Project) -> None:
    resolve_in_tree(stopped)
    patch = stopped.patches / "0002-parser-fix.patch"
    edited = name_the_bug(patch).replace("-line 20\n+line 20 fixed\n", "-line twenty\n+line twenty mended\n")
    patch.write_text(edited)
    commit_all(stopped, "0002 rewritten for v1.1 by hand")
    state = (stopped.root / ".git" / "vpatch-update" / "state.json").read_bytes()
    for _ in range(2):  # as often as it is asked: the same stop, nothing discarded
        code, out = run(stopped, "update", "--continue")
        assert code == 5, out
        flat = " ".join(out.split())
        assert "0002-parser-fix.patch has two different resolutions" in flat, out
        assert "patches/0002-parser-fix.patch as edited by hand" in flat and "the update tree's (vllm/parser.py)" in flat
        assert "nothing was discarded" in flat and "hint:" in out
        assert (tree_of(stopped) / "vllm/parser.py").read_text() == RESOLVED
        assert git(tree_of(stopped), "diff", "--name-only", "--diff-filter=U") == ""
        assert patch.read_text() == edited
        assert not (stopped.root / ".git" / "vpatch-resolutions").exists()
    assert (stopped.root / ".git" / "vpatch-update" / "state.json").read_bytes() != state  # the commit taken in
    # the person keeps the file's: the tree's work undone as the hint says, then one --continue
    git(tree_of(stopped), "reset", "-q", "--hard")
    code, out = run(stopped, "update", "--continue")
    assert code == 0, out
    text = patch.read_text()
    assert "+line twenty mended" in text and "Vendor-Bug: PARSE-1234" in text


def test_a_hand_edit_holding_the_trees_resolution_is_taken_in_once(stopped: Project) -> None:
    resolve_in_tree(stopped)
    patch = stopped.patches / "0002-parser-fix.patch"
    edited = name_the_bug(patch).replace("-line 20\n+line 20 fixed\n", "-line twenty\n+line twenty fixed\n")
    patch.write_text(edited)
    commit_all(stopped, "0002 rewritten for v1.1 by hand, as in the tree")
    code, out = run(stopped, "update", "--continue")
    assert code == 0, out
    assert "set aside" not in out and not (stopped.root / ".git" / "vpatch-resolutions").exists()
    text = patch.read_text()
    assert "+line twenty fixed" in text and "Vendor-Bug: PARSE-1234" in text


def test_a_hand_edit_that_conflicts_again_is_resolved_in_the_tree_and_taken_in_once(stopped: Project) -> None:
    patch = stopped.patches / "0002-parser-fix.patch"
    patch.write_text(patch.read_text().replace("+line 20 fixed\n", "+line 20 mended\n"))  # still on v1.0's line
    commit_all(stopped, "0002 edited by hand, not yet for v1.1")
    code, out = run(stopped, "update", "--continue")
    assert code == 5 and "as edited by hand does not apply on v1.1 either: conflicts in vllm/parser.py" in out, out
    assert ">>>>>>> 0002-parser-fix.patch (hand-edited)" in (tree_of(stopped) / "vllm/parser.py").read_text()
    resolve_in_tree(stopped)  # the tree decides from here: the edited file is not applied over it again
    name_the_bug(patch)  # and a word in the header on top
    commit_all(stopped, "0002: name the vendor bug")
    code, out = run(stopped, "update", "--continue")
    assert code == 0, out
    assert "as edited by hand" not in out and "two different resolutions" not in out, out
    text = patch.read_text()
    assert "+line twenty fixed" in text and "mended" not in text and "Vendor-Bug: PARSE-1234" in text
