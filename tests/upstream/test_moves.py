"""Upstream moves on a generated git history shaped like vLLM's: a move on main, a move cherry-picked onto a
release branch, a file deleted outright, a file split into two near-equal halves; and the probe rule."""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import git, patch_of_head, write_config
from conftest import vpatch_cli as vpatch

from vpatch.base.paths import cache_dir
from vpatch.upstream import mirror, moves

SCHED = "".join(f"sched line {i}\n" for i in range(1, 31))
TOOL = "".join(f"tool line {i}\n" for i in range(1, 31))
MISC = "".join(f"misc line {i}\n" for i in range(1, 31))
KV = "".join(f"kv line {i}\n" for i in range(1, 41))
_clock = itertools.count()


@dataclass
class History:
    path: Path
    commits: dict[str, str]

    @property
    def url(self) -> str:
        return self.path.as_uri()


def _commit(path: Path, message: str, files: dict[str, str | None] | None = None) -> str:
    for name, content in (files or {}).items():
        if content is None:
            git(path, "rm", "-q", name)
            continue
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(content)
    git(path, "add", "-A")
    stamp = 1788220800 + 3600 * next(_clock)
    os.environ["GIT_AUTHOR_DATE"] = os.environ["GIT_COMMITTER_DATE"] = f"{stamp} +0000"
    git(path, "commit", "-q", "--allow-empty", "-m", message)
    return git(path, "rev-parse", "HEAD").strip()


def _move(path: Path, old: str, new: str, message: str) -> str:
    (path / new).parent.mkdir(parents=True, exist_ok=True)
    git(path, "mv", old, new)
    return _commit(path, message)


@pytest.fixture
def history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> History:
    """main: v1.0.0 -> #201 moves engine/sched.py to core/sched.py -> [releases/v1.1 forks, v1.1.0] -> #202 moves
    tool.py to tools/parser.py (cherry-picked -x onto releases/v1.1, tagged v1.1.1) -> #203 deletes misc.py
    -> #204 splits kv.py into kv/alloc.py and kv/free.py (22 of its 40 lines each) -> #205 fixes tools/parser.py."""
    for var in ("GIT_AUTHOR_DATE", "GIT_COMMITTER_DATE"):
        monkeypatch.setenv(var, os.environ[var])
    path = tmp_path / "vllm"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    c = {"base": _commit(path, "Initial", {"vllm/engine/sched.py": SCHED, "vllm/tool.py": TOOL, "vllm/misc.py": MISC,
                                           "vllm/kv.py": KV, "README": "vllm\n"})}
    git(path, "tag", "v1.0.0")
    c["sched-move"] = _move(path, "vllm/engine/sched.py", "vllm/core/sched.py", "[Refactor] Move the scheduler to core (#201)")
    git(path, "checkout", "-q", "-b", "releases/v1.1")
    c["v1.1.0"] = _commit(path, "Bump version to 1.1.0", {"VERSION": "1.1.0\n"})
    git(path, "tag", "v1.1.0")
    git(path, "checkout", "-q", "main")
    c["tool-move"] = _move(path, "vllm/tool.py", "vllm/tools/parser.py", "[Refactor] Move tool parsing (#202)")
    git(path, "checkout", "-q", "releases/v1.1")
    git(path, "cherry-pick", "-x", c["tool-move"])
    c["tool-pick"] = git(path, "rev-parse", "HEAD").strip()
    c["v1.1.1"] = _commit(path, "Bump version to 1.1.1", {"VERSION": "1.1.1\n"})
    git(path, "tag", "v1.1.1")
    git(path, "checkout", "-q", "main")
    c["misc-delete"] = _commit(path, "[Cleanup] Remove misc helpers (#203)", {"vllm/misc.py": None})
    lines = KV.splitlines(keepends=True)
    c["kv-split"] = _commit(path, "[Refactor] Split the kv module (#204)", {
        "vllm/kv.py": None, "vllm/kv/alloc.py": "".join(lines[:22]), "vllm/kv/free.py": "".join(lines[18:])})
    c["tool-fix"] = _commit(path, "[Tool] Fix tool line 20 (#205)", {
        "vllm/tools/parser.py": TOOL.replace("tool line 20\n", "tool line 20 fixed\n")})
    _commit(path, "[Docs] Keep main moving (#206)", {"README": "vllm, main\n"})
    return History(path, c)


PATCHES = {
    "sched": ("vllm/engine/sched.py", SCHED, SCHED.replace("sched line 5\n", "sched line 5 local\n")),
    "tool": ("vllm/tool.py", TOOL, TOOL.replace("tool line 7\n", "tool line 7 local\n")),
    "misc": ("vllm/misc.py", MISC, MISC.replace("misc line 3\n", "misc line 3 local\n")),
    # in the lines both halves of the split share (19-22): no half holds the hunk whole, a person must choose
    # (a change in one half's lines alone follows its code: tests/upstream/test_hunkmoves.py)
    "kv": ("vllm/kv.py", KV, KV.replace("kv line 20\n", "kv line 20 local\n")),
    "tool-fix": ("vllm/tool.py", TOOL, TOOL.replace("tool line 20\n", "tool line 20 fixed\n")),
    # one hunk is upstream's #205 (made at the new path after the move), the other is local
    "tool-both": ("vllm/tool.py", TOOL, TOOL.replace("tool line 7\n", "tool line 7 local\n").replace(
        "tool line 20\n", "tool line 20 fixed\n")),
}


def make_project(tmp_path: Path, history: History, names: list[str]) -> Path:
    """Pinned at v1.0.0, one patch per name of PATCHES, each made on v1.0.0 at the old path."""
    root = tmp_path / "project"
    (root / "patches").mkdir(parents=True)
    write_config(root, history.url, ref="v1.0.0")
    scratch = tmp_path / "scratch"
    git(tmp_path, "clone", "-q", str(history.path), str(scratch))
    for number, name in enumerate(names, 1):
        path, _, after = PATCHES[name]
        git(scratch, "checkout", "-q", "--detach", "v1.0.0")
        (scratch / path).write_text(after)
        _commit(scratch, f"Change {name}\n\nWhy this change exists.\n\nOrigin: vendor\nLast-Update: 2026-09-01\n")
        raw = patch_of_head(scratch)
        (root / "patches" / f"{number:04d}-{name}.patch").write_text(raw)
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "project")
    mirror.fetch(cache_dir(), history.url)
    return root


@pytest.fixture
def project(tmp_path: Path, history: History) -> Path:
    return make_project(tmp_path, history, ["sched", "tool", "misc", "kv", "tool-fix"])


def status_json(root: Path, *args: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    """`vpatch status --json ARGS`: its exit code and the document on stdout (progress goes to stderr)."""
    from typer.testing import CliRunner

    from vpatch.commands.cli import app

    result = CliRunner().invoke(app, ["--project", str(root), "status", "--json", *args])
    return result.exit_code, json.loads(result.stdout)


def status(root: Path, *against: str) -> tuple[int, dict[str, dict]]:  # type: ignore[type-arg]
    args = [a for ref in against for a in ("--against", ref)]
    code, doc = status_json(root, "--exit-code", *args)
    return code, {p["slug"]: p for p in doc["patches"]}


def moved(cell: dict) -> list[dict]:  # type: ignore[type-arg]
    return [e for e in cell["evidence"] if e["kind"] == "moved"]


def test_each_kind_of_move_gets_its_verdict(project: Path, history: History) -> None:
    c = history.commits
    code, rows = status(project, "v1.1.1", "main")
    assert code == 4  # a person must look at the deleted and the split file

    # a move on main: followed, named with its commit and first release
    sched = rows["sched"]["results"]["main"]
    assert sched["state"] == "needed" and sched["applies"] == "clean", sched
    assert sched["moves"] == [{"old": "vllm/engine/sched.py", "fate": "moved", "new": "vllm/core/sched.py",
                               "similarity": 100, "candidates": [], "commit": c["sched-move"],
                               "subject": "[Refactor] Move the scheduler to core (#201)", "release": "v1.1.0",
                               "via": None}]
    (ev,) = moved(sched)
    assert ev["says"] == "neutral"
    assert ev["detail"].startswith("vllm/engine/sched.py -> vllm/core/sched.py (similarity 100%, in "
                                   f"{c['sched-move'][:12]} \"[Refactor] Move the scheduler to core (#201)\" "
                                   "(release v1.1.0))")

    # a move cherry-picked onto a release branch: on the branch the cherry-pick moved it, in v1.1.1; on main the
    # original commit did, and its first release is v1.1.1 too (as the cherry-pick)
    on_branch = rows["tool"]["results"]["v1.1.1"]
    assert on_branch["state"] == "needed", on_branch
    assert f"vllm/tool.py -> vllm/tools/parser.py (similarity 100%, in {c['tool-pick'][:12]}" in moved(on_branch)[0]["detail"]
    assert "(release v1.1.1)" in moved(on_branch)[0]["detail"]
    on_main = rows["tool"]["results"]["main"]
    assert on_main["state"] == "needed" and f"in {c['tool-move'][:12]}" in moved(on_main)[0]["detail"]
    assert "(release v1.1.1)" in moved(on_main)[0]["detail"]

    # deleted outright: not guessed, a person must look
    misc = rows["misc"]["results"]["main"]
    assert misc["state"] == "conflict" and misc["decided_by"] == "moved", misc
    assert moved(misc)[0]["says"] == "unavailable"
    assert f"vllm/misc.py was deleted in {c['misc-delete'][:12]}" in moved(misc)[0]["detail"]
    assert "vllm/misc.py deleted upstream, not guessed: a person must look" in misc["summary"]
    assert rows["misc"]["results"]["v1.1.1"]["state"] == "needed"  # the release branch still has it

    # split into two near-equal halves: not guessed either, both candidates named
    kv = rows["kv"]["results"]["main"]
    assert kv["state"] == "conflict" and kv["decided_by"] == "moved", kv
    detail = moved(kv)[0]["detail"]
    assert f"vllm/kv.py was split in {c['kv-split'][:12]}" in detail, detail
    # git scores the halves 56% and 54% (the larger half keeps a few more bytes): within 10 points, about equal
    assert "vllm/kv/free.py 56%, vllm/kv/alloc.py 54% match about equally" in detail

    # upstream's fix made after the move, at the new path: landed, and bisection finds the commit
    fix = rows["tool-fix"]
    assert fix["results"]["main"]["state"] == "landed" and fix["results"]["v1.1.1"]["state"] == "needed"
    assert fix["landed_in"]["commit"] == c["tool-fix"] and fix["landed_in"]["bisected"]


def test_moves_are_found_only_for_missing_paths_and_then_answered_from_the_cache(
        project: Path, history: History, monkeypatch: pytest.MonkeyPatch) -> None:
    from vpatch import git as vgit
    from vpatch.upstream import commitcache

    repo = mirror.mirror_path(cache_dir(), history.url)
    base, tip = history.commits["base"], git(history.path, "rev-parse", "main").strip()
    assert moves.missing_paths(repo, base, tip, ["README", "vllm/misc.py", "vllm/new.py"]) == ["vllm/misc.py"]
    first = moves.follow(repo, base, tip, ["vllm/misc.py", "vllm/engine/sched.py"])
    assert first["vllm/misc.py"].fate is moves.Fate.DELETED and first["vllm/engine/sched.py"].new == "vllm/core/sched.py"
    # a second process (the cache read back from disk) answers without any rename detection
    commitcache.reset()

    def no_rename_detection(*args: object, **kwargs: object) -> None:
        raise AssertionError("rename detection ran although the cache holds the answer")

    monkeypatch.setattr(vgit, "renames_and_deletions", no_rename_detection)
    monkeypatch.setattr(vgit, "best_rename_among", no_rename_detection)
    assert moves.follow(repo, base, tip, ["vllm/misc.py", "vllm/engine/sched.py"]) == first


def test_update_follows_moves_narrows_a_partial_moved_patch_and_apply_ref_and_export_name_the_new_paths(
        tmp_path: Path, history: History) -> None:
    root = make_project(tmp_path, history, ["sched", "tool-both"])
    # a files probe reading the patch's file and one it does not touch: both moved by main
    probe = ("kind: files\nfiles:\n  vllm/tool.py:\n    contains: [\"tool line 7 local\"]\n"
             "  vllm/engine/sched.py:\n    contains: [\"sched line 1\\n\"]\n")
    (root / "patches" / "probes").mkdir()
    (root / "patches" / "probes" / "tool.yaml").write_text(probe)
    both_file = root / "patches" / "0002-tool-both.patch"
    both_file.write_text(both_file.read_text().replace("Last-Update: 2026-09-01\n",
                                                       "Last-Update: 2026-09-01\nProbe: probes/tool.yaml\n"))
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "probe")
    code, out = vpatch(root, "update", "--to", "main")
    assert code == 0, out
    assert "moved: vllm/engine/sched.py -> vllm/core/sched.py" in out and "git am -3" in out
    assert "rename detection for vllm/engine/sched.py, vllm/tool.py" in out  # progress, on stderr
    message = git(root, "log", "-1", "--format=%B")
    assert message.splitlines()[0] == "Update upstream pin v1.0.0 -> main: narrow 0002"
    assert "Re-targeted: upstream moved vllm/engine/sched.py -> vllm/core/sched.py" in message
    assert "Re-targeted: upstream moved vllm/tool.py -> vllm/tools/parser.py" in message
    sched = (root / "patches" / "0001-sched.patch").read_text()
    both = (root / "patches" / "0002-tool-both.patch").read_text()
    assert "diff --git a/vllm/core/sched.py b/vllm/core/sched.py" in sched and "engine/sched.py" not in sched
    assert "+tool line 7 local" in both and "tool line 20 fixed" not in both and "vllm/tools/parser.py" in both
    # the probe's keys follow both moves; it was validated on main following them
    assert (root / "patches" / "probes" / "tool.yaml").read_text() == probe.replace(
        "vllm/tool.py", "vllm/tools/parser.py").replace("vllm/engine/sched.py", "vllm/core/sched.py")
    assert "Probes re-validated on main" in message
    code, rows = status(root)
    assert code == 0 and {r["results"]["main"]["state"] for r in rows.values()} == {"needed"}, rows


def test_apply_onto_a_ref_follows_the_move_and_export_writes_the_new_path(tmp_path: Path, history: History) -> None:
    root = make_project(tmp_path, history, ["sched"])
    code, out = vpatch(root, "apply", "--ref", "v1.1.0")
    assert code == 0, out
    tree = root / ".vpatch" / "tree"
    assert "sched line 5 local" in (tree / "vllm/core/sched.py").read_text()
    assert not (tree / "vllm/engine/sched.py").exists()
    assert vpatch(root, "export")[0] == 0
    assert "diff --git a/vllm/core/sched.py b/vllm/core/sched.py" in (root / "patches" / "0001-sched.patch").read_text()


def test_a_hand_edit_after_apply_onto_a_ref_is_not_overwritten_by_the_retargeting_export(
        tmp_path: Path, history: History) -> None:
    root = make_project(tmp_path, history, ["sched"])
    assert vpatch(root, "apply", "--ref", "v1.1.0")[0] == 0
    path = root / "patches" / "0001-sched.patch"
    edited = path.read_text().replace("Why this change exists.", "Why this change exists, said by hand.")
    path.write_text(edited)
    code, out = vpatch(root, "export")
    assert code == 1 and "patches/0001-sched.patch was changed since vpatch last wrote it" in out, out
    assert path.read_text() == edited
    code, out = vpatch(root, "export", "--force")
    assert code == 0, out
    assert "diff --git a/vllm/core/sched.py b/vllm/core/sched.py" in path.read_text()


@pytest.mark.parametrize(("name", "said"), [
    ("misc", "vllm/misc.py was deleted in {misc-delete} \"[Cleanup] Remove misc helpers (#203)\""),
    ("kv", "vllm/kv.py was split in {kv-split} \"[Refactor] Split the kv module (#204)\""),
])
def test_apply_onto_a_ref_where_the_file_was_deleted_or_split_says_so(
        tmp_path: Path, history: History, name: str, said: str) -> None:
    root = make_project(tmp_path, history, [name])
    ref = history.commits["kv-split"]
    code, out = vpatch(root, "apply", "--ref", ref)
    assert code != 0 and f"patch 0001-{name}.patch does not apply to {ref}" in out, out
    expected = said.format(**{k: v[:12] for k, v in history.commits.items()})
    assert f"a file it changes is not on {ref}: {expected}" in out, out
    assert "not guessed" in out and not (root / ".vpatch" / "tree").exists()


def test_files_probes_on_deleted_and_split_files_count_only_where_absence_is_said_to_be_the_fix(
        tmp_path: Path, history: History) -> None:
    root = make_project(tmp_path, history, ["misc", "kv"])
    probes_dir = root / "patches" / "probes"
    probes_dir.mkdir()
    # each also checks the patch's own line while the file is there: status validates a probe on the pin as
    # update does (fail there, pass with the patch), and absence alone cannot pass with a patch that keeps the file
    (probes_dir / "gone.yaml").write_text(
        "kind: files\nfiles:\n  vllm/misc.py:\n    contains: [\"misc line 3 local\\n\"]\n    absent_is_fix: true\n")
    (probes_dir / "split.yaml").write_text(
        "kind: files\nfiles:\n  vllm/kv.py:\n    contains: [\"kv line 20 local\\n\"]\n    absent_is_fix: true\n")
    for number, probe in ((1, "gone"), (2, "split")):
        name_probe(root, number, probe)
    code, doc = status_json(root, "--exit-code", "--against", "main")
    cells = {p["file"][:4]: p["results"]["main"] for p in doc["patches"]}
    # the probe says the file being gone is the fix, and it is gone with no successor: that decides
    assert cells["0001"]["state"] == "landed" and cells["0001"]["decided_by"] == "probe", cells["0001"]
    # a split file is not gone: absence cannot be read, the probe errs and the split decides (a person must look)
    probe = next(e for e in cells["0002"]["evidence"] if e["kind"] == "probe")
    assert probe["says"] == "unavailable" and "vllm/kv.py was split" in probe["detail"], probe
    assert cells["0002"]["state"] == "conflict" and cells["0002"]["decided_by"] == "moved"
    assert code == 4

    # not_contains on a deleted file used to pass vacuously (and drop the patch); now it errs, counted neither way
    # (a project of its own: the same misc patch twice would not apply over itself)
    root = make_project(tmp_path / "vacuous", history, ["misc"])
    (root / "patches" / "probes").mkdir()
    (root / "patches" / "probes" / "vacuous.yaml").write_text(
        "kind: files\nfiles:\n  vllm/misc.py:\n    not_contains: [\"misc line 3\\n\"]\n")
    name_probe(root, 1, "vacuous")
    code, doc = status_json(root, "--exit-code", "--against", "main")
    cell = doc["patches"][0]["results"]["main"]
    probe = next(e for e in cell["evidence"] if e["kind"] == "probe")
    assert probe["says"] == "unavailable" and "a missing file is no evidence either way" in probe["detail"], probe
    assert cell["state"] == "conflict" and cell["decided_by"] == "moved"
    assert code == 4


def name_probe(root: Path, number: int, probe: str) -> None:
    """Give patch `number` the trailer `Probe: probes/<probe>.yaml`."""
    patch = next((root / "patches").glob(f"{number:04d}-*.patch"))
    patch.write_text(patch.read_text().replace("Last-Update: 2026-09-01\n", f"Last-Update: 2026-09-01\nProbe: probes/{probe}.yaml\n"))
