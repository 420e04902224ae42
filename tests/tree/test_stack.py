"""apply / export: the series as commits on the pin, and back to byte-identical files."""

from __future__ import annotations

import json

import pytest
from conftest import KV_V1, PARSER_V1, Project, git, snapshot
from conftest import vpatch_cli as run

from vpatch.base.errors import JournalError
from vpatch.tree import stack


def three_patches(project: Project) -> None:
    project.make_patch(1, "kv-skip-null", {"vllm/kv.py": KV_V1.replace("break", "continue")}, "Skip null blocks")
    project.make_patch(2, "parser-fix", {"vllm/parser.py": PARSER_V1.replace("line 20\n", "line 20 fixed\n")}, "Fix the parser")
    project.make_patch(5, "new-module", {"vllm/extra.py": "EXTRA = 1\n"}, "Add an extra module",
                       trailers="Origin: vendor\nUpstream-PR: 123\nLast-Update: 2026-09-02")


def test_apply_commits_each_patch_with_its_author_and_message(project: Project) -> None:
    three_patches(project)
    code, out = run(project, "apply")
    assert code == 0, out
    tree = project.root / ".vpatch" / "tree"
    log = git(tree, "log", "--format=%an|%ad|%s", "--date=iso-strict", "v1.0..HEAD")
    assert log.splitlines() == [
        "Test Person|2026-09-01T12:00:00+00:00|Add an extra module",
        "Test Person|2026-09-01T12:00:00+00:00|Fix the parser",
        "Test Person|2026-09-01T12:00:00+00:00|Skip null blocks",
    ]
    assert (tree / "vllm/kv.py").read_text().count("continue") == 1
    assert (tree / "vllm/extra.py").read_text() == "EXTRA = 1\n"


def test_unchanged_export_is_byte_identical(project: Project) -> None:
    three_patches(project)
    before = snapshot(project.root)
    assert run(project, "apply")[0] == 0
    code, out = run(project, "export")
    assert code == 0, out
    assert "nothing to export: 3 patch(es) unchanged" in out
    assert snapshot(project.root) == before


def test_round_trip_edit_one_commit_and_add_another(project: Project) -> None:
    three_patches(project)
    before = snapshot(project.root)
    assert run(project, "apply")[0] == 0
    tree = project.root / ".vpatch" / "tree"
    # edit the middle patch (0002) with an interactive-rebase-like fixup: amend it and replay the top one
    top = git(tree, "rev-parse", "HEAD").strip()
    git(tree, "checkout", "-q", "HEAD~1")
    (tree / "vllm/parser.py").write_text(PARSER_V1.replace("line 20\n", "line 20 fixed better\n"))
    git(tree, "commit", "-q", "-a", "--amend", "--no-edit")
    git(tree, "cherry-pick", top)
    (tree / "vllm/new.py").write_text("NEW = True\n")
    git(tree, "add", "vllm/new.py")
    git(tree, "commit", "-q", "-m", "Add a new thing\n\nBecause.")

    code, out = run(project, "export")
    assert code == 0, out
    after = snapshot(project.root)
    changed = {k for k in after if after.get(k) != before.get(k)}
    assert changed == {"patches/0002-parser-fix.patch", "patches/0006-add-a-new-thing.patch"}
    assert b"+line 20 fixed better" in after["patches/0002-parser-fix.patch"]
    assert b"Vpatch-File" not in after["patches/0006-add-a-new-thing.patch"]
    assert after["patches/0001-kv-skip-null.patch"] == before["patches/0001-kv-skip-null.patch"]
    # and the exported series applies again to the same result
    assert run(project, "apply", "--force")[0] == 0
    assert (tree / "vllm/new.py").read_text() == "NEW = True\n"


def test_export_removes_a_dropped_commit(project: Project) -> None:
    three_patches(project)
    assert run(project, "apply")[0] == 0
    tree = project.root / ".vpatch" / "tree"
    git(tree, "rebase", "-q", "--onto", "HEAD~2", "HEAD~1")  # drop 0002
    code, out = run(project, "export")
    assert code == 0, out
    assert "removed: 0002-parser-fix.patch" in out
    assert sorted(p.name for p in project.patches.glob("*.patch")) == ["0001-kv-skip-null.patch", "0005-new-module.patch"]


def test_export_dry_run_says_what_it_would_do_and_writes_nothing(project: Project) -> None:
    three_patches(project)
    assert run(project, "apply")[0] == 0
    tree = project.root / ".vpatch" / "tree"
    git(tree, "rebase", "-q", "--onto", "HEAD~2", "HEAD~1")  # drop 0002
    (tree / "vllm/new.py").write_text("NEW = True\n")
    git(tree, "add", "vllm/new.py")
    git(tree, "commit", "-q", "-m", "Add a new thing\n\nBecause.")
    before = snapshot(project.root)
    code, out = run(project, "export", "--dry-run")
    assert code == 0, out
    assert "would add: 0006-add-a-new-thing.patch" in out
    assert "would remove: 0002-parser-fix.patch" in out
    assert snapshot(project.root) == before
    code, out = run(project, "export")
    assert "added: 0006-add-a-new-thing.patch" in out and "removed: 0002-parser-fix.patch" in out


def test_failing_patch_names_file_and_hunk_and_leaves_nothing(project: Project) -> None:
    project.make_patch(1, "kv-skip-null", {"vllm/kv.py": KV_V1.replace("break", "continue")}, "Skip null blocks")
    project.make_patch(2, "parser-fix", {"vllm/parser.py": PARSER_V1.replace("line 20\n", "line 20 fixed\n")}, "Fix the parser")
    project.upstream.commit({"vllm/parser.py": PARSER_V1.replace("line 20\n", "line twenty\n")}, "v1.1", tag="v1.1")
    run(project, "fetch")
    code, out = run(project, "apply", "--ref", "v1.1")
    assert code == 5, out
    assert "patch 0002-parser-fix.patch does not apply to v1.1" in out
    assert "vllm/parser.py hunk 1 (@@ -17,7 +17,7 @@)" in out
    assert "a 3-way apply would not succeed either" in out
    assert not (project.root / ".vpatch" / "tree").exists()
    assert not list((project.root / ".vpatch").glob(".tree*"))


def test_failing_patch_with_keep_leaves_tree_to_fix(project: Project) -> None:
    project.make_patch(1, "kv-skip-null", {"vllm/kv.py": KV_V1.replace("break", "continue")}, "Skip null blocks")
    project.make_patch(2, "parser-fix", {"vllm/parser.py": PARSER_V1.replace("line 20\n", "line 20 fixed\n")}, "Fix the parser")
    project.upstream.commit({"vllm/parser.py": PARSER_V1.replace("line 17\n", "line seventeen\n")}, "v1.1", tag="v1.1")
    run(project, "fetch")
    code, out = run(project, "apply", "--ref", "v1.1", "--keep")
    assert code == 5
    assert "a 3-way apply would succeed" in out
    tree = project.root / ".vpatch" / "tree"
    assert git(tree, "log", "--format=%s", "v1.1..HEAD").splitlines() == ["Skip null blocks"]
    assert "vpatch export" in out


def test_apply_refuses_to_replace_unexported_work(project: Project) -> None:
    three_patches(project)
    assert run(project, "apply")[0] == 0
    tree = project.root / ".vpatch" / "tree"
    (tree / "vllm/kv.py").write_text("edited\n")
    code, out = run(project, "apply")
    assert code == 1
    assert "holds work that is not exported (uncommitted changes)" in out
    assert (tree / "vllm/kv.py").read_text() == "edited\n"


def test_a_corrupt_tree_record_is_an_error_naming_it_and_apply_force_rebuilds(project: Project) -> None:
    three_patches(project)
    assert run(project, "apply")[0] == 0
    record = project.root / ".vpatch" / "tree.json"
    record.write_text('{"worktree": ')  # cut short, as a full disk or a crashed editor leaves it
    for command in (["export"], ["apply"], ["new", "x"]):
        code, out = run(project, *command)
        assert code == 1, (command, out)
        assert "the record of the applied tree" in out and "tree.json is unreadable" in out, (command, out)
        assert "vpatch apply --force" in out and "Traceback" not in out
    assert (project.root / ".vpatch" / "tree" / "vllm").is_dir()  # refused: the tree is still there
    code, out = run(project, "apply", "--force")
    assert code == 0, out
    assert run(project, "export")[0] == 0  # the new record is whole again


@pytest.mark.parametrize(("field", "value", "why"), [
    ("ref", 5, "its 'ref' is missing or not a string"),
    ("applied", [{"file": "0001-kv-skip-null.patch"}], "its 'applied' must be a list of {file, commit} strings"),
    ("base", None, "its 'base' is missing or not a string"),
])
def test_a_tree_record_with_a_wrong_field_is_a_journal_error_naming_the_file(project: Project, field: str,
                                                                               value: object, why: str) -> None:
    """Whole JSON with a wrong field is refused on load as a cut-short file is, not read into a half-typed tree."""
    three_patches(project)
    assert run(project, "apply")[0] == 0
    record = project.root / ".vpatch" / "tree.json"
    data = json.loads(record.read_text())
    data[field] = value
    broken = json.dumps(data)
    record.write_text(broken)
    with pytest.raises(JournalError) as caught:
        stack.load_stack(project.root / ".vpatch")
    assert caught.value.message == f"the record of the applied tree {record} is unreadable: {why}"
    assert caught.value.hint is not None and "vpatch apply --force" in caught.value.hint
    code, out = run(project, "export")
    assert code == 1 and why in out and "Traceback" not in out, out
    assert record.read_text() == broken  # refused before anything was written


def test_new_patch_takes_next_free_number(project: Project) -> None:
    three_patches(project)
    assert run(project, "apply")[0] == 0
    code, out = run(project, "new", "fix-thing", "--subject", "Fix the thing")
    assert code == 0, out
    assert "0006-fix-thing.patch" in out
    tree = project.root / ".vpatch" / "tree"
    (tree / "vllm/thing.py").write_text("THING = 1\n")
    git(tree, "add", "vllm/thing.py")
    git(tree, "commit", "-q", "--amend", "--no-edit")
    # the template's lines to fill in are refused by name until filled in or deleted (issue 22)
    code, out = run(project, "export")
    assert code == 1 and "with the body line 'Describe the problem, the change, and how it was verified.': " \
        "template text left in (and 3 more such line(s))" in out, out
    message = git(tree, "log", "-1", "--format=%B").replace("Describe the problem, the change, and how it was "
                                                             "verified.", "Add the thing module.")
    git(tree, "commit", "-q", "--amend", "--cleanup=verbatim", "-F", "-", input=message.encode())
    code, out = run(project, "export")
    assert code == 1 and "with the trailer 'Bug: <upstream issue URL, or delete>': template text left in" in out, out
    kept = [line for line in message.splitlines() if not line.startswith(("Bug:", "Upstream-PR:", "Probe:"))]
    git(tree, "commit", "-q", "--amend", "--cleanup=verbatim", "-F", "-", input="\n".join(kept).encode() + b"\n")
    code, out = run(project, "export")
    assert code == 0, out
    text = (project.patches / "0006-fix-thing.patch").read_text()
    assert "Subject: Fix the thing" in text and "Origin: vendor" in text and "Probe:" not in text


def test_empty_series_applies(project: Project) -> None:
    code, out = run(project, "apply")
    assert code == 0, out
    assert "applied 0 patch(es) onto v1.0" in out
