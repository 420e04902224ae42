"""update narrows a partly-landed patch (issue 14): drops the hunks upstream has, keeps the rest, proves it."""

from __future__ import annotations

from pathlib import Path

from conftest import KV_V1, PARSER_V1, Project, git
from conftest import vpatch_cli as run
from conftest import vpatch_json as run_json
from helpers.project import commit_all

from vpatch.series.files import Patch, Series

# 0001 changes the parser in three places; hunk 2 grows the file by two lines, so hunk 3's new-side
# line numbers move when hunk 2 is dropped.
THREE = (PARSER_V1.replace("line 5\n", "line 5 fixed\n")
         .replace("line 20\n", "line 20a\nline 20b\nline 20c\n")
         .replace("line 35\n", "line 35 fixed\n"))
HUNK_2_ONLY = PARSER_V1.replace("line 20\n", "line 20a\nline 20b\nline 20c\n")
PROBE = "kind: files\nfiles:\n  vllm/parser.py:\n    contains: [\"line 35 fixed\"]\n"


def three_hunks(project: Project, probe: str | None = PROBE) -> Path:
    trailers = "Origin: vendor\nForwarded: no\n" + ("Probe: probes/parser.yaml\n" if probe else "") + "Last-Update: 2026-09-01"
    path = project.make_patch(1, "parser-three", {"vllm/parser.py": THREE}, "Fix the parser in three places",
                              trailers=trailers)
    if probe:
        (project.patches / "probes").mkdir(exist_ok=True)
        (project.patches / "probes" / "parser.yaml").write_text(probe)
    commit_all(project)
    return path


def release(project: Project, files: dict[str, str | None], tag: str) -> None:
    project.upstream.commit(files, f"Upstream change for {tag}")
    project.upstream.commit({"README": f"toy vllm {tag}\n"}, tag, tag=tag)
    assert run(project, "fetch")[0] == 0


def hunk_headers(path: Path) -> list[str]:
    return [h.header.split(" @@")[0] + " @@" for fd in Patch.load(path).files for h in fd.hunks]


def test_update_narrows_a_partly_landed_patch_in_one_commit(project: Project) -> None:
    path = three_hunks(project)
    old = Patch.load(path)
    release(project, {"vllm/parser.py": HUNK_2_ONLY}, "v1.1")
    before = git(project.root, "rev-parse", "HEAD").strip()

    code, out = run(project, "update", "--to", "v1.1")
    assert code == 0, out
    assert "narrow" in out and "drops 1 of 3 hunks" in out
    # the file keeps its name, number, header and trailers; only hunks 1 and 3 remain, 3 renumbered
    assert sorted(p.name for p in project.patches.glob("*.patch")) == ["0001-parser-three.patch"]
    new = Patch.load(path)
    assert hunk_headers(path) == ["@@ -2,7 +2,7 @@", "@@ -34,7 +34,7 @@"]
    assert new.subject == old.subject and new.author == old.author and new.date == old.date
    assert new.trailer("Probe") == "probes/parser.yaml" and new.trailer("Origin") == "vendor"
    assert new.trailer("Last-Update") not in (None, "2026-09-01")
    assert new.body.split("\n\n")[0] == old.body.split("\n\n")[0]
    # one commit holds it, with the dropped hunk, its evidence and where it first is upstream
    assert git(project.root, "rev-list", f"{before}..HEAD").split() == [git(project.root, "rev-parse", "HEAD").strip()]
    assert git(project.root, "status", "--porcelain") == ""
    message = git(project.root, "log", "-1", "--format=%B")
    first = git(project.upstream.path, "rev-parse", "v1.1~1").strip()
    assert message.startswith("Update upstream pin v1.0 -> v1.1: narrow 0001\n")
    assert "- 0001-parser-three.patch: Fix the parser in three places: drops 1 of 3 hunks, keeps 2" in message
    assert "  Dropped: vllm/parser.py hunk 2 (@@ -17,7 +17,9 @@)" in message
    assert (f"Applied-Upstream: v1.1 (first commit {first[:12]} \"Upstream change for v1.1\"; "
            "bisected: 1 check over 2 commits)") in message
    assert "Evidence: reverse-applies on v1.1" in message
    assert "Kept: vllm/parser.py hunk 1" in message and "Kept: vllm/parser.py hunk 3" in message
    assert "Proof: on v1.1, the narrowed patch and the old patch (3-way merged) give identical files" in message
    assert "Probe: probes/parser.yaml re-validated on v1.1" in message
    assert "Refreshed" not in message  # narrowed is said once, not again as refreshed
    retired = (project.patches / "RETIRED.md").read_text()
    assert "## 0001-parser-three (narrowed)" in retired and "- Dropped hunk: vllm/parser.py hunk 2" in retired
    assert f"first commit {first[:12]}" in retired and f"`git show {before[:12]}:patches/0001-parser-three.patch`" in retired
    # the narrowed record does not retire the number: the series still loads, 0001 in it
    assert [p.number for p in Series.load(project.patches)] == [1]
    # the applied tree on the new pin is exactly what the old patch made on the old one
    assert run(project, "apply")[0] == 0
    assert (project.root / ".vpatch" / "tree" / "vllm" / "parser.py").read_text() == THREE
    # status now calls it needed, with the probe failing upstream and the diff applying cleanly
    code, doc = run_json(project, "status", "--json")
    assert code == 0, doc
    result = doc["patches"][0]["results"]["v1.1"]
    assert result["state"] == "needed" and result["applies"] == "clean"


def test_dry_run_and_status_say_would_narrow_and_change_nothing(project: Project) -> None:
    three_hunks(project)
    release(project, {"vllm/parser.py": HUNK_2_ONLY}, "v1.1")
    before = (project.patches / "0001-parser-three.patch").read_bytes()
    code, out = run(project, "update", "--to", "v1.1", "--dry-run")
    assert code == 0, out
    assert "would narrow: drops 1 of 3 hunks" in out  # the status table's partial cell
    assert "would narrow   0001-parser-three.patch  [partial]" in out
    assert (project.patches / "0001-parser-three.patch").read_bytes() == before
    code, doc = run_json(project, "status", "--against", "v1.1", "--json")
    result = doc["patches"][0]["results"]["v1.1"]
    assert result["summary"].startswith("1/3 hunks upstream: parser.py #2")
    # status's disposition is the dry run's: narrowed, with the proof
    assert result["disposition"]["action"] == "narrow" and result["disposition"]["proof"], result["disposition"]
    assert [h["hunk"] for h in result["disposition"]["dropped_hunks"]] == ["vllm/parser.py hunk 2 (@@ -17,7 +17,9 @@)"]


def test_no_narrow_stops_at_the_partial_patch_as_before(project: Project) -> None:
    three_hunks(project, probe=None)
    release(project, {"vllm/parser.py": HUNK_2_ONLY}, "v1.1")
    code, out = run(project, "update", "--to", "v1.1", "--no-narrow")
    assert code == 5, out
    assert "stopped at 0001-parser-three.patch: 0001-parser-three.patch is partial on v1.1" in out
    assert len(hunk_headers(project.patches / "0001-parser-three.patch")) == 3
    assert run(project, "update", "--abort")[0] == 0


def test_a_narrowed_patch_whose_probe_no_longer_validates_stops(project: Project) -> None:
    # the probe also wants a README that v1.1 changed: it fails on v1.1 with or without the patch
    probe = PROBE + "  README:\n    contains: [\"toy vllm\\n\"]\n    not_contains: [v1.1]\n"
    three_hunks(project, probe=probe)
    release(project, {"vllm/parser.py": HUNK_2_ONLY}, "v1.1")
    before = (project.patches / "0001-parser-three.patch").read_bytes()
    code, out = run(project, "update", "--to", "v1.1")
    assert code == 5, out
    assert "stopped at 0001-parser-three.patch" in out
    assert "not narrowed: its probe does not validate the narrowed patch on v1.1" in out
    assert "Upstream already has (leave these out): vllm/parser.py hunk 2 (@@ -17,7 +17,9 @@)" in out
    assert (project.patches / "0001-parser-three.patch").read_bytes() == before
    assert run(project, "update", "--abort")[0] == 0


def test_a_partial_patch_whose_remaining_hunk_conflicts_stops_naming_the_landed_hunks(project: Project) -> None:
    three_hunks(project, probe=None)
    release(project, {"vllm/parser.py": HUNK_2_ONLY.replace("line 35\n", "line 35 changed upstream\n")}, "v1.1")
    code, out = run(project, "update", "--to", "v1.1")
    assert code == 5, out
    assert "stopped at 0001-parser-three.patch: 0001-parser-three.patch is partial on v1.1" in out
    assert ("not narrowed: the remaining hunks do not apply, not even with a 3-way merge: "
            "vllm/parser.py hunk 3 (@@ -32,7 +34,7 @@). Upstream") in out
    assert ("Upstream already has (leave these out): vllm/parser.py hunk 2 (@@ -17,7 +17,9 @@). "
            "Resolve only: vllm/parser.py hunk 1 (@@ -2,7 +2,7 @@); vllm/parser.py hunk 3 (@@ -32,7 +34,7 @@)") in out
    assert len(hunk_headers(project.patches / "0001-parser-three.patch")) == 3
    assert run(project, "update", "--abort")[0] == 0


def test_remaining_hunks_that_need_a_3way_merge_are_narrowed_that_way(project: Project) -> None:
    three_hunks(project, probe=None)
    # upstream lands hunk 2 and edits line 33, inside hunk 3's context: hunk 3 applies only 3-way
    release(project, {"vllm/parser.py": HUNK_2_ONLY.replace("line 33\n", "line 33 upstream\n")}, "v1.1")
    code, doc = run_json(project, "status", "--against", "v1.1", "--json")
    made = doc["patches"][0]["results"]["v1.1"]["disposition"]
    # narrowed as the update narrows it: the rest goes on by a clean 3-way merge, proven
    assert made["action"] == "narrow" and "3-way merge" in made["proof"], made
    code, out = run(project, "update", "--to", "v1.1")
    assert code == 0, out
    assert "Applies by a clean 3-way merge" in git(project.root, "log", "-1", "--format=%B")
    assert len(hunk_headers(project.patches / "0001-parser-three.patch")) == 2
    assert run(project, "apply")[0] == 0
    expected = THREE.replace("line 33\n", "line 33 upstream\n")
    assert (project.root / ".vpatch" / "tree" / "vllm" / "parser.py").read_text() == expected


def test_a_narrowing_survives_a_stop_at_a_later_patch_and_continue(project: Project) -> None:
    three_hunks(project, probe=None)
    project.make_patch(2, "kv-skip-null", {"vllm/kv.py": KV_V1.replace("break", "continue")}, "Skip null blocks")
    commit_all(project, "0002")
    # v1.1 lands 0001's hunk 2 and changes kv.py's line differently: 0002 conflicts
    release(project, {"vllm/parser.py": HUNK_2_ONLY, "vllm/kv.py": KV_V1.replace("break", "return")}, "v1.1")
    code, doc = run_json(project, "update", "--to", "v1.1", "--json")
    assert code == 5, doc
    assert doc["stop"]["file"] == "0002-kv-skip-null.patch"
    assert doc["patches"][0]["narrowing"]["dropped"][0]["name"] == "vllm/parser.py hunk 2 (@@ -17,7 +17,9 @@)"
    tree = project.root / ".git" / "vpatch-update" / "tree"
    (tree / "vllm/kv.py").write_text(KV_V1.replace("break", "continue"))
    git(tree, "add", "vllm/kv.py")
    code, out = run(project, "update", "--continue")
    assert code == 0, out
    message = git(project.root, "log", "-1", "--format=%B")
    assert message.startswith("Update upstream pin v1.0 -> v1.1: narrow 0001\n")
    assert len(hunk_headers(project.patches / "0001-parser-three.patch")) == 2
    assert "## 0001-parser-three (narrowed)" in (project.patches / "RETIRED.md").read_text()
    assert run(project, "apply")[0] == 0
    assert (project.root / ".vpatch" / "tree" / "vllm" / "parser.py").read_text() == THREE


def test_the_proof_refuses_a_hunk_found_only_elsewhere_in_the_file(project: Project) -> None:
    three_hunks(project, probe=None)
    # v1.1 edits line 18 (inside hunk 2's context, so hunk 2 does not apply plainly) and appends a copy of
    # hunk 2's post-image at the end of the file: hunk 2 reverse-applies there, so the verdict counts it as
    # upstream - but the spot it changes is still unchanged, and the old patch (merged 3-way) changes it
    copy = "".join(f"line {n}\n" for n in (17, 18, 19)) + "line 20a\nline 20b\nline 20c\n" + \
        "".join(f"line {n}\n" for n in (21, 22, 23))
    release(project, {"vllm/parser.py": PARSER_V1.replace("line 18\n", "line 18 upstream\n") + copy}, "v1.1")
    code, doc = run_json(project, "status", "--against", "v1.1", "--json")
    assert doc["patches"][0]["results"]["v1.1"]["hunks"]["landed"] == [
        "vllm/parser.py hunk 2 (@@ -17,7 +17,9 @@)"]
    before = (project.patches / "0001-parser-three.patch").read_bytes()
    code, out = run(project, "update", "--to", "v1.1")
    assert code == 5, out
    assert ("not narrowed: the narrowed patch's result differs from the old patch's 3-way merge on v1.1 in "
            "vllm/parser.py") in out
    assert (project.patches / "0001-parser-three.patch").read_bytes() == before
    assert run(project, "update", "--abort")[0] == 0


def test_a_narrowed_patch_without_last_update_gets_one_among_its_trailers(project: Project) -> None:
    from vpatch.update.narrow import narrowed_patch

    path = project.make_patch(1, "parser-three", {"vllm/parser.py": THREE}, "Fix the parser in three places",
                              trailers="Origin: vendor\nForwarded: no")
    old = Patch.load(path)
    assert old.trailer("Last-Update") is None
    drop = {"vllm/parser.py hunk 2 (@@ -17,7 +17,9 @@)"}
    new = narrowed_patch(old, drop, "2026-11-30")
    assert new.trailers == (("Origin", "vendor"), ("Forwarded", "no"), ("Last-Update", "2026-11-30"))
    assert new.body.startswith("Why this change exists.\n\n") and new.subject == old.subject
    assert hunk_headers_of(new) == ["@@ -2,7 +2,7 @@", "@@ -32,7 +32,7 @@"]
    # a message without a body: the trailer becomes the body
    bare = Patch.parse(old.raw.replace(b"Why this change exists.\n\nOrigin: vendor\nForwarded: no\n", b""),
                       number=1, slug="parser-three", path=path)
    assert bare.body == ""
    assert narrowed_patch(bare, drop, "2026-11-30").trailers == (("Last-Update", "2026-11-30"),)


def hunk_headers_of(patch: Patch) -> list[str]:
    return [h.header.split(" @@")[0] + " @@" for fd in patch.files for h in fd.hunks]


def test_a_file_whose_every_hunk_landed_leaves_the_narrowed_patch(project: Project) -> None:
    kv_fixed = KV_V1.replace("break", "continue")
    path = project.make_patch(1, "two-files", {"vllm/kv.py": kv_fixed, "vllm/parser.py": THREE}, "Fix kv and parser")
    commit_all(project)
    release(project, {"vllm/kv.py": kv_fixed}, "v1.1")
    code, out = run(project, "update", "--to", "v1.1")
    assert code == 0, out
    narrowed = Patch.load(path)
    assert [fd.path for fd in narrowed.files] == ["vllm/parser.py"] and len(narrowed.files[0].hunks) == 3
    assert "Dropped: vllm/kv.py hunk 1 (@@ -1,5 +1,5 @@)" in git(project.root, "log", "-1", "--format=%B")
    assert run(project, "apply")[0] == 0
    tree = project.root / ".vpatch" / "tree" / "vllm"
    assert (tree / "parser.py").read_text() == THREE and (tree / "kv.py").read_text() == kv_fixed


def test_a_hand_edit_of_a_patch_file_survives_narrowing_and_the_stale_tree_cannot_export_over_it(
        project: Project) -> None:
    path = three_hunks(project)
    assert run(project, "apply")[0] == 0
    path.write_text(path.read_text().replace("+line 35 fixed\n", "+line 35 fixed by hand\n"))
    (project.patches / "probes" / "parser.yaml").write_text(PROBE.replace("line 35 fixed", "line 35 fixed by hand"))
    commit_all(project, "0001 edited by hand")
    release(project, {"vllm/parser.py": HUNK_2_ONLY}, "v1.1")
    code, out = run(project, "update", "--to", "v1.1")
    assert code == 0 and "drops 1 of 3 hunks" in out, out
    narrowed = path.read_text()
    assert "+line 35 fixed by hand\n" in narrowed and "line 20a" not in narrowed
    code, out = run(project, "export")
    assert code == 1 and "patches/0001-parser-three.patch was changed since vpatch last wrote it" in out, out
    assert path.read_text() == narrowed
