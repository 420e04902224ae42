"""export writes only what vpatch reads back, keeps a new commit's number, and handles any file name git can."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import KV_V1, Project, git, snapshot
from conftest import vpatch_cli as run

from vpatch.base.errors import SeriesError
from vpatch.series.files import Patch, Series


@pytest.fixture
def applied(project: Project) -> Path:
    project.make_patch(1, "kv-skip-null", {"vllm/kv.py": KV_V1.replace("break", "continue")}, "Skip null blocks")
    code, out = run(project, "apply")
    assert code == 0, out
    return project.root / ".vpatch" / "tree"


def test_a_plain_new_commit_keeps_its_number_over_several_exports(project: Project, applied: Path) -> None:
    (applied / "vllm/new.py").write_text("NEW = 1\n")
    git(applied, "add", "-A")
    git(applied, "commit", "-q", "-m", "Add a new module")
    for _ in range(3):
        code, out = run(project, "export")
        assert code == 0, out
        assert sorted(p.name for p in project.patches.glob("*.patch")) == [
            "0001-kv-skip-null.patch", "0002-add-a-new-module.patch"]
    # amended (a new SHA, same subject): still the same number
    (applied / "vllm/new.py").write_text("NEW = 2\n")
    git(applied, "commit", "-q", "-a", "--amend", "--no-edit")
    code, out = run(project, "export")
    assert code == 0 and "changed: 0002-add-a-new-module.patch" in out, out
    assert sorted(p.name for p in project.patches.glob("*.patch")) == [
        "0001-kv-skip-null.patch", "0002-add-a-new-module.patch"]


def test_export_of_an_empty_new_patch_is_refused_and_writes_nothing(project: Project, applied: Path) -> None:
    code, out = run(project, "new", "nothing-yet")
    assert code == 0, out
    before = snapshot(project.root)
    code, out = run(project, "export")
    assert code == 1, out
    assert "changes nothing" in out and "nothing was written" in out and "Traceback" not in out
    assert snapshot(project.root) == before
    # every other command still reads the series
    assert len(Series.load(project.patches)) == 1
    assert run(project, "apply", "--force")[0] == 0


def test_file_names_with_spaces_tabs_and_non_ascii_round_trip(project: Project, applied: Path) -> None:
    names = ["vllm/my module.py", "vllm/tab\tname.py", "vllm/caf\u00e9.py", 'vllm/quote".py']
    for name in names:
        (applied / name).write_text("X = 1\n")
    (applied / "vllm/kv.py").rename(applied / "vllm/kv store.py")
    git(applied, "add", "-A")
    git(applied, "commit", "-q", "-m", "Odd file names")
    code, out = run(project, "export")
    assert code == 0, out
    patch = Series.load(project.patches).get("2")
    assert sorted(f.path for f in patch.files) == sorted([*names, "vllm/kv store.py", "vllm/kv.py"])
    # and it applies back onto a fresh tree, byte for byte the same files
    code, out = run(project, "apply", "--force")
    assert code == 0, out
    for name in names:
        assert (applied / name).read_text() == "X = 1\n"
    assert (applied / "vllm/kv store.py").is_file() and not (applied / "vllm/kv.py").exists()


def parse(diff: bytes) -> Patch:
    return Patch.parse(b"Subject: [PATCH] x\n\n---\n" + diff, number=1, slug="x", path=Path("0001-x.patch"))


@pytest.mark.parametrize(("diff", "message"), [
    (b'diff --git "a/\\x" "b/\\x"\nnew file mode 100644\n', "bad escape in the quoted path"),
    (b'diff --git "a/x "b/x"\nnew file mode 100644\n', "bad escape|unterminated|cannot tell"),
    (b'diff --git "a/\\351t" "b/\\351t"\nnew file mode 100644\n', "not UTF-8"),
    (b"diff --git a/x b/y\nsimilarity index 100%\nrename from x\nrename to ../x\n", "outside the tree"),
    (b"diff --git a/x b/x\nsimilarity index 100%\nrename from x\nrename to .git/hooks/x\n", "inside the .git folder"),
    (b"diff --git a/x y b/z w\nold mode 100644\nnew mode 100755\n", "cannot tell the file names"),
])
def test_bad_paths_are_refused_with_a_message(diff: bytes, message: str) -> None:
    with pytest.raises(SeriesError, match=message):
        parse(diff)


def test_quoted_and_spaced_header_paths_parse() -> None:
    patch = parse(b'diff --git "a/t\\tx" "b/t\\tx"\nnew file mode 100644\nindex 0000000..1111111\n--- /dev/null\n'
                  b'+++ "b/t\\tx"\n@@ -0,0 +1 @@\n+x\n'
                  b"diff --git a/my file b/my file\ndeleted file mode 100644\n--- a/my file\t\n+++ /dev/null\n"
                  b"@@ -1 +0,0 @@\n-x\n")
    assert [(f.old_path, f.new_path) for f in patch.files] == [(None, "t\tx"), ("my file", None)]


# --- a hand edit of a patch file is never overwritten unasked -----------------------------------------

HAND = "+            continue  # a line written by hand in the patch file\n"


def hand_edit(path: Path) -> str:
    """Change an added line of the file's hunk by hand (the line count stays right, so it still parses)."""
    text = path.read_text()
    edited = text.replace("+            continue\n", HAND)
    assert edited != text
    path.write_text(edited)
    return edited


def test_export_refuses_a_hand_edited_patch_file_naming_it_and_both_ways_on(project: Project, applied: Path) -> None:
    path = project.patches / "0001-kv-skip-null.patch"
    edited = hand_edit(path)
    before = snapshot(project.root)
    for args in (("export",), ("export", "--dry-run")):
        code, out = run(project, *args)
        assert code == 1, out
        assert "patches/0001-kv-skip-null.patch was changed since vpatch last wrote it" in out
        assert "nothing was written" in out
        assert "`vpatch apply --force`" in out and "`vpatch export --force`" in out
        assert snapshot(project.root) == before
    # keep the file: apply --force reads it into the tree, and export then keeps the edit (it only brings
    # the file's `index` line, which the hand edit left stale, to the blobs it names)
    code, out = run(project, "apply", "--force")
    assert code == 0, out
    assert "# a line written by hand" in (applied / "vllm/kv.py").read_text()
    assert run(project, "export")[0] == 0
    assert HAND in path.read_text()
    assert [line for line in path.read_text().splitlines() if not line.startswith("index ")] == [
        line for line in edited.splitlines() if not line.startswith("index ")]
    # an edit made in the tree is exported as before; then a hand edit again, and keep the tree's version
    (applied / "vllm/kv.py").write_text(KV_V1.replace("break", "continue  # from the tree"))
    git(applied, "commit", "-q", "-a", "--amend", "--no-edit")
    assert run(project, "export")[0] == 0
    assert "from the tree" in path.read_text()
    path.write_text(path.read_text().replace("# from the tree", "# by hand again"))
    assert run(project, "export")[0] == 1
    code, out = run(project, "export", "--force")
    assert code == 0 and "changed: 0001-kv-skip-null.patch" in out, out
    assert "from the tree" in path.read_text() and "by hand again" not in path.read_text()


def test_export_refuses_to_remove_or_bring_back_a_file_it_did_not_write(project: Project, applied: Path) -> None:
    path = project.patches / "0001-kv-skip-null.patch"
    # a patch file added by hand after the tree was applied: export would remove it
    added = project.patches / "0002-by-hand.patch"
    added.write_bytes(path.read_bytes().replace(b"Skip null blocks", b"Written by hand"))
    code, out = run(project, "export")
    assert code == 1 and "patches/0002-by-hand.patch is not a patch of the applied tree" in out, out
    assert added.is_file()
    added.unlink()
    # a patch file deleted by hand: export would write it again from the tree
    path.unlink()
    code, out = run(project, "export")
    assert code == 1 and "patches/0001-kv-skip-null.patch was removed since vpatch last wrote it" in out, out
    assert not path.exists()
    assert run(project, "export", "--force")[0] == 0 and path.is_file()


def test_a_record_of_an_older_vpatch_without_digests_exports_as_before(project: Project, applied: Path) -> None:
    import json

    record = project.root / ".vpatch" / "tree.json"
    data = json.loads(record.read_text())
    assert all("sha256" in a for a in data["applied"])
    for a in data["applied"]:
        del a["sha256"]
    record.write_text(json.dumps(data))
    hand_edit(project.patches / "0001-kv-skip-null.patch")
    code, out = run(project, "export")
    assert code == 0 and "changed: 0001-kv-skip-null.patch" in out, out
    assert all("sha256" in a for a in json.loads(record.read_text())["applied"])


def test_export_refuses_the_template_body_left_in_like_template_trailers(project: Project, applied: Path) -> None:
    assert run(project, "new", "log-ids")[0] == 0
    (applied / "vllm/log.py").write_text("IDS = True\n")
    git(applied, "add", "-A")
    message = git(applied, "log", "-1", "--format=%B")
    # the trailers finished (the <...> ones deleted, the Probe: line too), the body as the template wrote it
    finished = "\n".join(line for line in message.splitlines() if not line.startswith(("Bug:", "Upstream-PR:", "Probe:")))
    git(applied, "commit", "-q", "--amend", "-F", "-", input=finished.encode())
    before = snapshot(project.root)
    code, out = run(project, "export")
    assert code == 1, out
    assert ("would export as 0002-log-ids.patch with the body line 'Describe the problem, the change, and how it "
            "was verified.': template text left in; nothing was written") in out
    assert snapshot(project.root) == before
    described = finished.replace("Describe the problem, the change, and how it was verified.",
                                 "Log the request ids; checked by reading the log.")
    git(applied, "commit", "-q", "--amend", "-F", "-", input=described.encode())
    code, out = run(project, "export")
    assert code == 0 and "added: 0002-log-ids.patch" in out, out
