"""Writing a patch and its probe as a newcomer does (issue 22): each friction point found on the way, on small real
projects: `probe check` / `probe new`, probe validation in status and update --dry-run, probe errors with their
reasons, template placeholders, apply --out, hunk counts, and the small things."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import KV_V1, Project, git, snapshot
from conftest import vpatch_cli as run

from vpatch.probes.file import Probe
from vpatch.probes.outcome import ProbeKind

KV_FIX = KV_V1.replace("break", "continue")
GOOD = "kind: files\nfiles:\n  vllm/kv.py:\n    contains: [continue]\n    not_contains: [break]\n"
# a string the patched tree does not have either: fails on the pin and with the patch
NEVER_PASSES = "kind: files\nfiles:\n  vllm/kv.py:\n    contains: [skip_null_blocks]\n"


def commit_all(project: Project) -> None:
    if not (project.root / ".git").exists():
        git(project.root, "init", "-q", "-b", "main")
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "project")


def kv_patch(project: Project, probe_yaml: str | None, *, number: int = 1, probe: str = "probes/0001-kv.yaml") -> Path:
    if probe_yaml is not None:
        (project.patches / "probes").mkdir(exist_ok=True)
        (project.patches / probe).write_text(probe_yaml)
    return project.make_patch(number, "kv", {"vllm/kv.py": KV_FIX}, "Skip null blocks",
                              trailers=f"Origin: vendor\nProbe: {probe}\nLast-Update: 2026-09-01")


# --- vpatch probe check ---------------------------------------------------------------------------


def test_probe_check_runs_the_probe_without_and_with_the_patch(project: Project) -> None:
    kv_patch(project, GOOD)
    code, out = run(project, "probe", "check", "1")
    assert code == 0, out
    assert "0001-kv.yaml on v1.0 (" in out and ": FAIL" in out
    assert "vllm/kv.py: lacks 'continue'; vllm/kv.py: still has 'break'" in out  # the probe's own words
    assert "0001-kv.yaml on v1.0 + the series up to 0001-kv: PASS" in out
    assert "ok: 0001-kv.yaml fails without the patch and passes with it" in out


def test_probe_check_refuses_a_probe_that_never_passes(project: Project) -> None:
    kv_patch(project, NEVER_PASSES)
    code, out = run(project, "probe", "check", "0001")
    assert code == 1, out
    assert out.count(": FAIL") == 2 and "lacks 'skip_null_blocks'" in out
    assert "does not discriminate" in out and "fails on v1.0 without the patch and fails with it" in out
    assert "hint: the probe still fails with the patch" in out


def test_probe_check_applies_the_series_up_to_the_patch(project: Project) -> None:
    # 0002 is written on top of 0001 (same lines): alone it does not even apply to the pin
    project.make_patch(1, "kv", {"vllm/kv.py": KV_FIX}, "Skip null blocks")
    scratch = project.root.parent / "scratch-1"
    (project.patches / "probes").mkdir()
    (project.patches / "probes" / "0002-kv-log.yaml").write_text(
        "kind: files\nfiles:\n  vllm/kv.py:\n    contains: ['log(b)']\n")
    git(scratch, "checkout", "-q", "HEAD")  # the scratch clone holds 0001's commit: build 0002 on it
    (scratch / "vllm/kv.py").write_text(KV_FIX.replace("release(b)", "log(b)\n        release(b)"))
    git(scratch, "commit", "-q", "-am", "Log freed blocks\n\nWhy.\n\nOrigin: vendor\nProbe: probes/0002-kv-log.yaml")
    raw = git(scratch, "format-patch", "-1", "--stdout", "--zero-commit", "--full-index", "--no-signature",
              "--no-stat", "-k", "HEAD")
    (project.patches / "0002-kv-log.patch").write_text(raw)
    code, out = run(project, "probe", "check", "2")
    assert code == 0, out
    assert "on v1.0 + the series up to 0002-kv-log: PASS" in out


def test_probe_check_shows_why_a_command_probe_could_not_decide(project: Project) -> None:
    (project.patches / "probes").mkdir()
    (project.patches / "probes" / "0001-kv.py").write_text(
        "import sys\nprint('KVCacheManager takes no enable_caching: cannot run the scenario')\nsys.exit(2)\n")
    kv_patch(project, 'kind: command\nrun: ["{python}", "{probe_dir}/0001-kv.py"]\nrequirements: []\ntimeout: 60\n')
    code, out = run(project, "probe", "check", "1")
    assert code == 1, out
    # the pin's side errors, which decides already: the side with the patch is not run, and the output says so
    assert out.count(": ERROR") == 1 and "0001-kv.yaml on v1.0 (" in out.split(": ERROR")[0].splitlines()[-1]
    assert "with the patch" not in out.split(": ERROR")[0].splitlines()[-1]
    assert "up to 0001-kv: not run (the other side errored, which decides already)" in out
    assert "stopped there (one error already makes the probe invalid): not run with the patch" in out
    assert "exit code 2 (only 0 and 1 decide)" in out and "KVCacheManager takes no enable_caching" in out
    assert "hint: the probe could not decide: KVCacheManager takes no enable_caching" in out


def test_probe_check_names_a_patch_without_a_probe(project: Project) -> None:
    project.make_patch(1, "kv", {"vllm/kv.py": KV_FIX}, "Skip null blocks")
    code, out = run(project, "probe", "check", "1")
    assert code == 1 and "0001-kv.patch names no probe" in out
    assert "vpatch probe new 0001 --kind files" in out and "Probe: probes/0001-kv.yaml" in out


# --- vpatch probe new -----------------------------------------------------------------------------


def test_probe_new_files_template_starts_from_the_patch_and_validates(project: Project) -> None:
    kv_patch(project, None)
    code, out = run(project, "probe", "new", "1", "--kind", "files")
    assert code == 0, out
    path = project.patches / "probes" / "0001-kv.yaml"
    assert f"wrote {path}" in out and "0001-kv.patch already names it" in out
    probe = Probe.load(path)  # the template is a valid probe ...
    assert probe.kind is ProbeKind.FILES and probe.files[0].path == "vllm/kv.py"
    assert probe.files[0].contains == ("continue",) and probe.files[0].not_contains == ("break",)
    assert run(project, "probe", "check", "1")[0] == 0  # ... here, one that already tells the two apart
    code, out = run(project, "probe", "new", "1")
    assert code == 1 and "exists already" in out  # never overwritten


def test_probe_new_command_template_follows_the_probe_rules(project: Project) -> None:
    kv_patch(project, None)
    code, out = run(project, "probe", "new", "0001-kv", "--kind", "command")
    assert code == 0, out
    probe = Probe.load(project.patches / "probes" / "0001-kv.yaml")
    assert probe.kind is ProbeKind.COMMAND and probe.timeout == 900 and probe.requirements == ()
    script = (project.patches / "probes" / "0001-kv.py").read_text()
    assert "Exit 2 when the API it drives does not take what the scenario needs" in script
    # an unwritten scenario cannot decide: exit 2, which check reports as an error, never as pass or fail
    code, out = run(project, "probe", "check", "1")
    assert code == 1 and out.count(": ERROR") == 1 and "the scenario is not written yet" in out  # it stops there


def test_probe_new_finds_a_patch_only_the_applied_tree_has(project: Project) -> None:
    assert run(project, "apply")[0] == 0
    assert run(project, "new", "sched-fix")[0] == 0
    code, out = run(project, "probe", "new", "1", "--kind", "files")
    assert code == 0, out
    assert (project.patches / "probes" / "0001-sched-fix.yaml").is_file()
    assert "Probe: probes/0001-sched-fix.yaml" in out


# --- status and update --dry-run validate as the real update does ------------------------------


def test_status_flags_a_probe_that_never_passes(project: Project) -> None:
    kv_patch(project, NEVER_PASSES)
    code, out = run(project, "status", "--exit-code")
    assert code == 4, out
    assert "probe INVALID: it fails on v1.0 without the patch and fails with it" in out
    # the words of the rule update and `probe check` apply (runner.validation), and its advice
    said = " ".join(out.split())  # the line under the table, as the terminal wraps it
    assert ("0001-kv.patch: its probe is INVALID: probe 0001-kv.yaml does not discriminate for 0001-kv.patch: it fails "
            "on v1.0 without the patch and fails with it (it must fail, then pass); the probe still fails with the "
            "patch: make it test what the patch changes") in said


def test_update_dry_run_refuses_what_the_real_update_refuses(project: Project) -> None:
    kv_patch(project, NEVER_PASSES)
    commit_all(project)
    project.upstream.commit({"README": "v1.1\n"}, "v1.1", tag="v1.1")
    assert run(project, "fetch")[0] == 0
    dry_code, dry = run(project, "update", "--to", "v1.1", "--dry-run")
    real_code, real = run(project, "update", "--to", "v1.1")
    assert (dry_code, real_code) == (1, 1), dry + real
    assert "would re-apply" not in dry and "probe INVALID: it fails on v1.0 without the patch" in dry  # the table, then
    # the plan says it is refused, for the reason status gives: the probe does not validate on the pin
    assert "would refuse   0001-kv.patch  [invalid-probe]" in dry
    error = ("error: not moving the pin to v1.1: 0001-kv.patch: its probe is INVALID: probe 0001-kv.yaml does not "
             "discriminate for 0001-kv.patch: it fails on v1.0 without the patch")
    assert error in dry and error in real
    assert dry.split("error: ")[1] == real.split("error: ")[1]  # word for word


def test_update_dry_run_shows_the_kept_probes_it_validated(project: Project) -> None:
    kv_patch(project, GOOD)
    commit_all(project)
    project.upstream.commit({"README": "v1.1\n"}, "v1.1", tag="v1.1")
    assert run(project, "fetch")[0] == 0
    code, out = run(project, "update", "--to", "v1.1", "--dry-run")
    assert code == 0, out
    assert "would re-apply" in out and "probe probes/0001-kv.yaml re-validated on v1.1" in out


def test_a_probe_error_is_shown_with_its_reason_and_needs_a_person(project: Project) -> None:
    kv_patch(project, "kind: files\nfiles:\n  vllm/kv.py:\n    not_contain: [break]\n")
    code, out = run(project, "status", "--exit-code")
    assert code == 4, out
    assert "not_contain: not a file check" in out  # the reason, in the table (was only in --json)
    assert "probes: 0 run, 0 from the cache, 1 could not decide" in out  # never counted as run
    doc = json.loads(run(project, "status", "--json")[1])
    assert doc["probes"]["errors"] == 1 and doc["exit_code"] == 4
    assert "not_contain: not a file check" in doc["probes"]["problems"][0]["why"]


def test_a_mistyped_path_under_not_contains_says_the_file_does_not_exist(project: Project) -> None:
    kv_patch(project, "kind: files\nfiles:\n  vllm/kv.py:\n    contains: [continue]\n"
                      "  vllm/kv_cache.py:\n    not_contains: [break]\n")
    code, out = run(project, "status", "--exit-code")
    assert code == 4, out
    missing = "files: vllm/kv_cache.py: no such file on v1.0 nor with the patch"
    assert missing in " ".join(out.split())  # status says it in the words of `probe check`: one rule
    code, out = run(project, "probe", "check", "1")
    assert code == 1 and missing in out


# --- placeholders and a Probe: naming no file ------------------------------------------------------


@pytest.mark.parametrize("line", ["Probe: probes/<probe>.yaml", "Bug: <upstream issue URL, or delete>",
                                  "Upstream-PR: <number of the upstream pull request, or delete>"])
def test_status_refuses_template_text(project: Project, line: str) -> None:
    project.make_patch(1, "kv", {"vllm/kv.py": KV_FIX}, "Skip null blocks", trailers=f"Origin: vendor\n{line}")
    code, out = run(project, "status")
    assert code == 1 and f"0001-kv.patch: trailer '{line}': template text left in" in out, out


def test_status_and_export_refuse_a_probe_trailer_naming_no_file(project: Project) -> None:
    kv_patch(project, None, probe="probes/kv.yaml")
    code, out = run(project, "status")
    assert code == 1 and "trailer 'Probe: probes/kv.yaml': names no file" in out, out
    assert "vpatch probe new 0001 --kind files" in out
    (project.patches / "probes").mkdir()
    (project.patches / "probes" / "kv.yaml").write_text(GOOD)
    assert run(project, "apply")[0] == 0
    (project.patches / "probes" / "kv.yaml").unlink()
    tree = project.root / ".vpatch" / "tree"
    (tree / "vllm/kv.py").write_text(KV_FIX + "# more\n")
    git(tree, "commit", "-q", "-a", "--amend", "--no-edit")
    before = snapshot(project.root)
    code, out = run(project, "export")
    assert code == 1 and "trailer 'Probe: probes/kv.yaml': names no file" in out and "nothing was written" in out
    assert snapshot(project.root) == before


# --- apply --out never strands work -------------------------------------------------------------


def _worktrees(project: Project) -> list[str]:
    record = json.loads((project.root / ".vpatch" / "tree.json").read_text())
    listing = git(Path(record["upstream"]), "worktree", "list", "--porcelain")
    return [line.split(" ", 1)[1] for line in listing.splitlines() if line.startswith("worktree ")][1:]


def test_apply_out_refuses_while_the_applied_tree_holds_unexported_work(project: Project, tmp_path: Path) -> None:
    kv_patch(project, GOOD)
    assert run(project, "apply")[0] == 0
    tree = project.root / ".vpatch" / "tree"
    (tree / "vllm/kv.py").write_text(KV_FIX + "# amended\n")
    git(tree, "commit", "-q", "-a", "--amend", "--no-edit")
    code, out = run(project, "apply", "--out", str(tmp_path / "other"))
    assert code == 1 and f"{tree.resolve()} holds work that is not exported (new or edited commits)" in out, out
    code, out = run(project, "export", "--dry-run")
    assert code == 0 and "would change: 0001-kv.patch" in out  # the work is still where export looks


def test_apply_out_elsewhere_removes_the_old_tree_and_its_registration(project: Project, tmp_path: Path) -> None:
    kv_patch(project, GOOD)
    assert run(project, "apply")[0] == 0
    other = tmp_path / "other"
    assert run(project, "apply", "--out", str(other))[0] == 0
    assert not (project.root / ".vpatch" / "tree").exists()
    assert [Path(p).resolve() for p in _worktrees(project)] == [other.resolve()]
    code, out = run(project, "apply")  # and back: nothing in the way
    assert code == 0, out
    assert [Path(p).resolve() for p in _worktrees(project)] == [(project.root / ".vpatch" / "tree").resolve()]


def test_apply_recovers_from_a_leftover_tree(project: Project) -> None:
    kv_patch(project, GOOD)
    assert run(project, "apply")[0] == 0
    record = (project.root / ".vpatch" / "tree.json").read_text()
    (project.root / ".vpatch" / "tree.json").unlink()  # the record lost: the tree is a leftover
    code, out = run(project, "apply")
    assert code == 0, out  # it holds nothing the series lacks: replaced
    assert len(_worktrees(project)) == 1
    # a leftover holding a commit the series does not have is refused without --force, replaced with it
    tree = project.root / ".vpatch" / "tree"
    (tree / "vllm/new.py").write_text("NEW = 1\n")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", "New module")
    (project.root / ".vpatch" / "tree.json").unlink()
    code, out = run(project, "apply")
    assert code == 1 and "holds work that is not exported (commit " in out, out
    code, out = run(project, "apply", "--force")
    assert code == 0, out
    assert len(_worktrees(project)) == 1 and not (tree / "vllm/new.py").exists()
    assert json.loads(record)["base"] == json.loads((project.root / ".vpatch" / "tree.json").read_text())["base"]


# --- a hunk whose line count is off --------------------------------------------------------------


def test_a_wrong_hunk_count_gets_the_header_that_fixes_it(project: Project) -> None:
    path = kv_patch(project, GOOD)
    good = path.read_text()
    broken = good.replace("+            continue\n", "+            continue\n+            # an extra line, not counted\n")
    assert broken != good
    path.write_text(broken)
    code, out = run(project, "status")
    assert code == 1 and "hunk @@ -1,5 +1,5 @@ in vllm/kv.py is longer than its header says" in out, out
    fixed_header = out.split("the header is ")[1].split(" (")[0]
    assert fixed_header == "@@ -1,5 +1,6 @@"
    # the hint works: that header makes the file load again
    old_header = next(line for line in broken.splitlines() if line.startswith("@@"))
    path.write_text(broken.replace(old_header, fixed_header + old_header.split("@@", 2)[2]))
    assert run(project, "status")[0] == 0


def test_export_rewrites_a_file_whose_hunk_count_was_broken_by_hand(project: Project) -> None:
    path = kv_patch(project, GOOD)
    good = path.read_text()
    assert run(project, "apply")[0] == 0
    broken = good.replace("@@ -1,5 +1,5 @@", "@@ -1,5 +1,4 @@")
    path.write_text(broken)
    # a hand edit, even a broken one, is not overwritten unasked
    code, out = run(project, "export")
    assert code == 1 and "patches/0001-kv.patch was changed since vpatch last wrote it" in out, out
    assert path.read_text() == broken
    code, out = run(project, "export", "--force")
    assert code == 0, out
    assert "changed: 0001-kv.patch" in out and "written afresh from its commit in the applied tree" in out
    assert path.read_text() == good


# --- the small things -----------------------------------------------------------------------------


def test_update_dry_run_works_with_uncommitted_changes_and_writes_nothing(project: Project) -> None:
    kv_patch(project, GOOD)
    commit_all(project)
    project.upstream.commit({"README": "v1.1\n"}, "v1.1", tag="v1.1")
    assert run(project, "fetch")[0] == 0
    (project.patches / "probes" / "0001-kv.yaml").write_text(GOOD + "# being edited\n")
    before = snapshot(project.root)
    code, out = run(project, "update", "--to", "v1.1", "--dry-run")
    assert code == 0, out
    # nothing written: the project's files and its git state (the lock file aside) are as they were
    assert "would re-apply" in out
    assert {k: v for k, v in snapshot(project.root).items() if k != ".git/vpatch.lock"} == before
    code, out = run(project, "update", "--to", "v1.1")  # the real one still wants them committed
    assert code == 1 and "uncommitted changes in the series or the pin" in out


def test_a_plain_commit_in_the_tree_is_said_to_become_a_new_patch(project: Project) -> None:
    kv_patch(project, GOOD)
    assert run(project, "apply")[0] == 0
    tree = project.root / ".vpatch" / "tree"
    (tree / "vllm/kv.py").write_text(KV_FIX + "# meant as an amend\n")
    git(tree, "commit", "-q", "-am", "Tweak kv")
    code, out = run(project, "export")
    assert code == 0, out
    assert "added: 0002-tweak-kv.patch" in out
    assert "note: a new patch, from a commit without a Vpatch-File line (a plain `git commit`" in out
    assert "git commit --amend" in out


def test_version(project: Project) -> None:
    from importlib.metadata import version

    code, out = run(project, "--version")
    assert code == 0 and out.strip() == f"vpatch {version('vpatch')}"


def test_new_prints_the_tree_and_the_next_step(project: Project) -> None:
    assert run(project, "apply")[0] == 0
    code, out = run(project, "new", "sched-fix")
    assert code == 0, out
    tree = (project.root / ".vpatch" / "tree").resolve()
    assert f"started 0001-sched-fix.patch as an empty commit in the applied tree {tree}" in out
    assert f"git -C {tree} commit --amend -a" in out and "vpatch probe new 0001 --kind files" in out
    assert "Probe: probes/0001-sched-fix.yaml" in git(tree, "log", "-1", "--format=%B")


def test_a_filled_in_mail_address_is_not_template_text(project: Project) -> None:
    from vpatch.series.files import Patch
    from vpatch.series.trailers import unfinished

    path = project.make_patch(1, "kv", {"vllm/kv.py": KV_FIX}, "Skip null blocks",
                              trailers="Origin: vendor\nCo-authored-by: A Person <a.person@example.invalid>\n"
                                       "Bug: <upstream issue URL, or delete>")
    assert [line for line, _, _ in unfinished(Patch.load(path))] == ["trailer 'Bug: <upstream issue URL, or delete>'"]


def test_probe_check_before_export_reads_the_commit_in_the_applied_tree(project: Project) -> None:
    assert run(project, "apply")[0] == 0
    assert run(project, "new", "kv")[0] == 0
    code, out = run(project, "probe", "check", "1")
    assert code == 1 and "0001-kv changes nothing yet" in out
    tree = project.root / ".vpatch" / "tree"
    (tree / "vllm/kv.py").write_text(KV_FIX)
    git(tree, "commit", "-q", "-a", "--amend", "--no-edit")
    assert run(project, "probe", "new", "1")[0] == 0  # prefilled from the commit's diff
    code, out = run(project, "probe", "check", "1")
    assert code == 0 and "on v1.0 + the series up to 0001-kv: PASS" in out, out


# --- which version of the patch a check reads ------------------------------------------------------


def test_probe_check_reads_an_unexported_amend_in_the_tree_and_says_so(project: Project) -> None:
    kv_patch(project, GOOD)
    assert run(project, "apply")[0] == 0
    tree = project.root / ".vpatch" / "tree"
    # exported, nothing changed since: patches/ is read, nothing said about the tree
    code, out = run(project, "probe", "check", "1")
    assert code == 0 and "from the applied tree" not in out, out
    # the commit amended so the fix the probe requires is gone, not exported
    (tree / "vllm/kv.py").write_text(KV_V1.replace("break", "pass"))
    git(tree, "commit", "-q", "-a", "--amend", "--no-edit")
    for args in (("probe", "check", "1"), ("probe", "check", "1", "--no-cache")):
        code, out = run(project, *args)
        assert code == 1, out
        assert f"reading 0001-kv.patch from the applied tree {tree.resolve()}" in out and "`vpatch export`" in out
        assert "does not discriminate" in out and "on v1.0 + the series up to 0001-kv: FAIL" in out
    # uncommitted edits are named as not checked
    (tree / "vllm/kv.py").write_text(KV_FIX)
    code, out = run(project, "probe", "check", "1")
    assert "uncommitted changes in the applied tree are not checked: vllm/kv.py" in out, out


def test_status_update_dry_run_and_build_warn_in_one_line_about_unexported_tree_work(project: Project) -> None:
    kv_patch(project, GOOD)
    commit_all(project)
    project.upstream.commit({"README": "v1.1\n"}, "v1.1", tag="v1.1")
    assert run(project, "fetch")[0] == 0
    assert run(project, "apply")[0] == 0
    tree = project.root / ".vpatch" / "tree"
    commands = (("status",), ("update", "--to", "v1.1", "--dry-run"), ("build", "no-such-image", "--plan"))
    for args in commands:  # nothing in the tree that patches/ lacks: no warning
        assert "not the applied tree's work" not in run(project, *args)[1]
    (tree / "vllm/kv.py").write_text(KV_FIX + "# amended\n")
    git(tree, "commit", "-q", "-a", "--amend", "--no-edit")
    (tree / "vllm/parser.py").write_text("edited\n")
    for args in commands:
        out = run(project, *args)[1]
        [line] = [line for line in out.splitlines() if "not the applied tree's work" in line]
        assert line == (f"warning: {' '.join(args[:1]) if args[0] != 'update' else 'update --dry-run'} reads "
                        "patches/, not the applied tree's work not exported yet: 0001-kv.patch and uncommitted "
                        "changes (vllm/parser.py); `vpatch export` first to include it"), out


# --- vpatch new ----------------------------------------------------------------------------------


def test_new_refuses_a_name_in_the_series_or_the_tree_naming_the_file(project: Project) -> None:
    kv_patch(project, GOOD)
    assert run(project, "apply")[0] == 0
    tree = project.root / ".vpatch" / "tree"
    before = git(tree, "rev-parse", "HEAD")
    code, out = run(project, "new", "kv")
    assert code == 1 and "a patch named 'kv' exists already: 0001-kv.patch, in patches/" in out, out
    assert run(project, "new", "sched-fix")[0] == 0
    started = git(tree, "rev-parse", "HEAD")
    code, out = run(project, "new", "sched-fix")
    assert code == 1, out
    assert f"a patch named 'sched-fix' exists already: 0002-sched-fix.patch, in the applied tree {tree.resolve()}" in out
    assert git(tree, "rev-parse", "HEAD") == started != before  # no second commit
    # another name gets the next number, not the one the unexported commit holds
    code, out = run(project, "new", "other")
    assert code == 0 and "started 0003-other.patch" in out, out


def test_new_without_a_git_identity_says_what_to_configure(project: Project, hermetic_git: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    assert run(project, "apply")[0] == 0  # apply needs no identity: it commits as each patch's author
    for var in ("AUTHOR", "COMMITTER"):
        for part in ("NAME", "EMAIL"):
            monkeypatch.delenv(f"GIT_{var}_{part}")
    monkeypatch.delenv("EMAIL", raising=False)
    # a fresh HOME: no user.name/user.email; useConfigOnly so git does not guess one from this machine's name
    (hermetic_git / ".gitconfig").write_text("[user]\n\tuseConfigOnly = true\n")
    tree = project.root / ".vpatch" / "tree"
    before = git(tree, "rev-parse", "HEAD")
    code, out = run(project, "new", "sched-fix")
    assert code == 1, out
    assert "git does not know who you are" in out and "exit code 128" not in out
    assert 'git config --global user.name "Your Name"' in out and "git config --global user.email" in out
    assert git(tree, "rev-parse", "HEAD") == before


# --- one table, one number, one message, one name ---------------------------------------------------


def test_exit_codes_in_the_readme_and_in_status_help_come_from_one_table(project: Project) -> None:
    import re

    from vpatch.base.errors import ExitCode, meaning

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    rows = dict(re.findall(r"^\| (\d+) \| (.+) \|$", readme.split("## Exit codes")[1].split("\n## ")[0], re.M))
    assert {int(k): v for k, v in rows.items()} == {int(c): meaning(c) for c in ExitCode}
    code, out = run(project, "status", "--help")
    text = " ".join(out.replace("│", " ").split())
    assert code == 0 and "exit 3: some patch has landed upstream and can be dropped" in text, text
    assert "exit 4: some patch needs a person: it conflicts, is only partly upstream, is disputed" in text
    assert "its probe is invalid (passes on the pin), or it breaks one of upstream's own tests on the pin (a " \
        "regression)." in text and "furthest" not in text


def test_probe_new_with_a_wrong_kind_hints_with_the_number_given(project: Project) -> None:
    kv_patch(project, None)
    code, out = run(project, "probe", "new", "5", "--kind", "cmd")
    assert code == 2 and "hint: vpatch probe new 5 --kind files" in out, out


def test_a_missing_probe_file_gets_one_message_from_status_and_probe_check(project: Project) -> None:
    kv_patch(project, None)
    said = ("0001-kv.patch: trailer 'Probe: probes/0001-kv.yaml': names no file "
            f"({project.patches / 'probes/0001-kv.yaml'} does not exist)")
    for args in (("status",), ("probe", "check", "1")):
        code, out = run(project, *args)
        assert code == 1 and f"error: {said}" in out, out
        assert "hint: `vpatch probe new 0001 --kind files` (or command) writes probes/0001-kv.yaml" in out
        assert "Errno" not in out


def test_a_command_probe_shows_the_line_that_decided_before_the_log_lines(project: Project) -> None:
    (project.patches / "probes").mkdir()
    (project.patches / "probes" / "0001-kv.py").write_text(
        "import sys\n"
        "print('INFO 12-01 21:03:04 [config.py:12] Resolved architecture: ToyForCausalLM')\n"
        "print('(EngineCore pid=7) WARNING 12-01 21:03:05 [cpu.py:40] no GPU, using the CPU')\n"
        "print('scenario reached the free loop')\n"
        "fixed = 'continue' in open('vllm/kv.py').read()\n"
        "print('PASS: null blocks are skipped' if fixed else 'FAIL: the loop stops at a null block')\n"
        "sys.exit(0 if fixed else 1)\n")
    kv_patch(project, 'kind: command\nrun: ["{python}", "{probe_dir}/0001-kv.py"]\nrequirements: []\ntimeout: 60\n')
    code, out = run(project, "probe", "check", "1")
    assert code == 0, out
    for header, verdict in ((": FAIL", "FAIL: the loop stops at a null block"), (": PASS", "PASS: null blocks are skipped")):
        lines = out.split(header, 1)[1].splitlines()[1:5]
        assert [line.strip() for line in lines] == [
            verdict, "scenario reached the free loop",
            "INFO 12-01 21:03:04 [config.py:12] Resolved architecture: ToyForCausalLM",
            "(EngineCore pid=7) WARNING 12-01 21:03:05 [cpu.py:40] no GPU, using the CPU"], out


def test_a_target_is_named_by_its_ref_in_the_update_refusal(project: Project) -> None:
    import re

    kv_patch(project, NEVER_PASSES)
    commit_all(project)
    project.upstream.commit({"README": "v1.1\n"}, "v1.1", tag="v1.1")
    assert run(project, "fetch")[0] == 0
    for args in (("update", "--to", "v1.1", "--dry-run"), ("update", "--to", "v1.1")):
        code, out = run(project, *args)
        # the target by its ref, the pin (where the probe does not validate) by its ref
        assert code == 1 and "not moving the pin to v1.1: " in out, out
        assert "it fails on v1.0 without the patch and fails with it" in out, out
        assert not re.search(r"\b[0-9a-f]{40}\b", out), out


def test_probe_check_after_the_trees_commit_lost_its_change_does_not_read_patches_silently(project: Project) -> None:
    kv_patch(project, GOOD)
    assert run(project, "apply")[0] == 0
    assert run(project, "probe", "check", "1")[0] == 0
    tree = project.root / ".vpatch" / "tree"
    # the whole change taken out of the exported commit (amended to change nothing): patches/ still has it
    (tree / "vllm/kv.py").write_text(KV_V1)
    git(tree, "commit", "-q", "-a", "--amend", "--allow-empty", "--no-edit")
    code, out = run(project, "probe", "check", "1")
    assert code == 1, out
    assert "the applied tree's commit of 0001-kv.patch changes nothing now" in out
    assert "not checking patches/ in the tree's place" in out and "PASS" not in out
