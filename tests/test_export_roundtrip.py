"""export writes only what vpatch reads back, keeps a new commit's number, and handles any file name git can."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import KV_V1, Project, git, snapshot
from conftest import vpatch_cli as run

from vpatch.errors import SeriesError
from vpatch.series import Patch, Series


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
