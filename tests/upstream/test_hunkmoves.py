"""Hunks that follow their code across file splits and between files, on a generated git history shaped like vLLM's.

main: v1.0.0 -> [releases/v1.1 forks, v1.1.0]
  -> #301 cuts vllm/engine.py into vllm/engine/core.py (alpha, the larger part: git pairs the old name with it),
     vllm/engine/beta.py and vllm/engine/gamma.py, fixing gamma's step 3 on the way (upstream's own change);
     cherry-picked -x onto releases/v1.1 and tagged v1.1.1
  -> #302 moves parse_flags from vllm/utils.py to the existing vllm/config.py
  -> #303 copies dup_me out of vllm/shared.py into two new files (the same code in both)
  -> #304 rewrites vllm/nv/model.py's kernel (vllm/amd/model.py keeps its copy from before, as at the pin) and adds
     vllm/next/model.py: a copy of the kernel with the local patch's change made in it
  -> v1.2.0
"""

from __future__ import annotations

import itertools
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import git, patch_of_head, write_config
from conftest import vpatch_cli as vpatch

from vpatch.base.paths import cache_dir
from vpatch.series.files import Series
from vpatch.upstream import commitcache, hunkmoves, mirror
from vpatch.verdict import judge as verdict


def function(name: str, size: int) -> str:
    """A function of `size` steps, every line telling (long and unique to it)."""
    return f"def {name}(state):\n" + "".join(f"    {name}_step_{i} = run_{name}(state, {i})\n"
                                           for i in range(1, size + 1)) + "    return state\n\n\n"


ALPHA, BETA, GAMMA = function("alpha", 60), function("beta", 15), function("gamma", 15)
HELPERS, PARSE, CONFIG = function("helper", 20), function("parse_flags", 12), function("configure", 20)
KEEP, DUP = function("keep", 20), function("dup_me", 12)
KERNEL = function("kernel", 12)
GAMMA_FIX = ("    gamma_step_3 = run_gamma(state, 3)\n", "    gamma_step_3 = run_gamma(state, 3) or state\n")
_clock = itertools.count()


@dataclass
class History:
    path: Path
    commits: dict[str, str]

    @property
    def url(self) -> str:
        return self.path.as_uri()


def _commit(path: Path, message: str, files: dict[str, str | None]) -> str:
    for name, content in files.items():
        if content is None:
            git(path, "rm", "-q", name)
            continue
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(content)
    git(path, "add", "-A")
    stamp = 1788220800 + 3600 * next(_clock)
    os.environ["GIT_AUTHOR_DATE"] = os.environ["GIT_COMMITTER_DATE"] = f"{stamp} +0000"
    git(path, "commit", "-q", "-m", message)
    return git(path, "rev-parse", "HEAD").strip()


SPLIT = {"vllm/engine.py": None, "vllm/engine/core.py": ALPHA, "vllm/engine/beta.py": BETA,
         "vllm/engine/gamma.py": GAMMA.replace(*GAMMA_FIX)}


@pytest.fixture
def history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> History:
    for var in ("GIT_AUTHOR_DATE", "GIT_COMMITTER_DATE"):
        monkeypatch.setenv(var, "1788220800 +0000")
    path = tmp_path / "vllm"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    c = {"base": _commit(path, "Initial", {"vllm/engine.py": ALPHA + BETA + GAMMA, "vllm/utils.py": HELPERS + PARSE,
                                           "vllm/config.py": CONFIG, "vllm/shared.py": KEEP + DUP, "README": "vllm\n",
                                           "vllm/nv/model.py": KERNEL, "vllm/amd/model.py": KERNEL})}
    git(path, "tag", "v1.0.0")
    git(path, "checkout", "-q", "-b", "releases/v1.1")
    c["v1.1.0"] = _commit(path, "Bump version to 1.1.0", {"VERSION": "1.1.0\n"})
    git(path, "tag", "v1.1.0")
    git(path, "checkout", "-q", "main")
    c["split"] = _commit(path, "[Refactor] Split the engine (#301)", SPLIT)
    git(path, "checkout", "-q", "releases/v1.1")
    git(path, "cherry-pick", "-x", c["split"])
    c["split-pick"] = git(path, "rev-parse", "HEAD").strip()
    c["v1.1.1"] = _commit(path, "Bump version to 1.1.1", {"VERSION": "1.1.1\n"})
    git(path, "tag", "v1.1.1")
    git(path, "checkout", "-q", "main")
    c["parse-move"] = _commit(path, "[Refactor] Move parse_flags to config (#302)",
                              {"vllm/utils.py": HELPERS, "vllm/config.py": CONFIG + PARSE})
    c["dup"] = _commit(path, "[Refactor] Share dup_me (#303)", {
        "vllm/shared.py": KEEP, "vllm/x/dup.py": function("x_only", 8) + DUP, "vllm/y/dup.py": function("y_only", 8) + DUP})
    c["nv"] = _commit(path, "[Model] Rework the nv kernel (#304)", {
        "vllm/nv/model.py": function("kernel_v2", 12), "vllm/next/model.py": local(KERNEL, "kernel", 6)})
    c["v1.2.0"] = _commit(path, "Bump version to 1.2.0", {"VERSION": "1.2.0\n"})
    git(path, "tag", "v1.2.0")
    return History(path, c)


def local(text: str, name: str, step: int) -> str:
    line = f"    {name}_step_{step} = run_{name}(state, {step})\n"
    assert text.count(line) == 1
    return text.replace(line, f"    {name}_step_{step} = run_{name}(state, {step}, local=True)\n")


# name -> (path -> the file after the change), each made on v1.0.0
PATCHES = {
    # one hunk in alpha (git pairs engine.py with core.py: followed there), one in beta (cut to beta.py)
    "split": {"vllm/engine.py": local(local(ALPHA + BETA + GAMMA, "alpha", 30), "beta", 8)},
    "gamma-local": {"vllm/engine.py": local(ALPHA + BETA + GAMMA, "gamma", 12)},
    "gamma-fix": {"vllm/engine.py": ALPHA + BETA + GAMMA.replace(*GAMMA_FIX)},  # upstream's own, landed with #301
    "parse": {"vllm/utils.py": HELPERS + local(PARSE, "parse_flags", 6)},
    "dup": {"vllm/shared.py": KEEP + local(DUP, "dup_me", 6)},
    "nv": {"vllm/nv/model.py": local(KERNEL, "kernel", 6)},
    "beta": {"vllm/engine.py": ALPHA + local(BETA, "beta", 8) + GAMMA},
    # a copy of the lines around beta's step 8 (steps 5 to 11) put after its step 15
    "beta-copy": {"vllm/engine.py": ALPHA + BETA.replace("    beta_step_15 = run_beta(state, 15)\n", "".join(
        f"    beta_step_{i} = run_beta(state, {i})\n" for i in (15, *range(5, 12)))) + GAMMA},
    "helper": {"vllm/utils.py": local(HELPERS, "helper", 10) + PARSE},
}


def make_project(tmp_path: Path, history: History, names: list[str], *, probes: dict[str, str] | None = None) -> Path:
    """Pinned at v1.0.0, one patch per name of PATCHES; `probes`: name -> a files probe's YAML for that patch."""
    root = tmp_path / "project"
    (root / "patches" / "probes").mkdir(parents=True)
    write_config(root, history.url, ref="v1.0.0")
    scratch = tmp_path / "scratch"
    git(tmp_path, "clone", "-q", str(history.path), str(scratch))
    for number, name in enumerate(names, 1):
        git(scratch, "checkout", "-q", "--detach", "v1.0.0")
        trailer = ""
        if probes and name in probes:
            (root / "patches" / "probes" / f"{name}.yaml").write_text(probes[name])
            (root / "patches" / "probes" / "beta.py").write_text(BETA_PROBE)
            (root / "patches" / "probes" / "alpha.py").write_text(probe_script("run_alpha(state, 30, local=True)"))
            trailer = f"Probe: probes/{name}.yaml\n"
        _commit(scratch, f"Change {name}\n\nWhy this change exists.\n\nOrigin: vendor\nLast-Update: 2026-09-01\n{trailer}",
                PATCHES[name])
        (root / "patches" / f"{number:04d}-{name}.patch").write_text(patch_of_head(scratch))
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "project")
    mirror.fetch(cache_dir(), history.url)
    return root


def probe_script(needle: str) -> str:
    """A behavioural probe's script: passes where `needle` is anywhere in the package (wherever the code lives)."""
    return f"""import pathlib
import sys

found = any({needle!r} in p.read_text() for p in pathlib.Path("vllm").rglob("*.py"))
sys.exit(0 if found else 1)
"""


BETA_PROBE = probe_script("run_beta(state, 8, local=True)")


def status(root: Path, *against: str) -> tuple[int, dict[str, dict]]:  # type: ignore[type-arg]
    import json

    from typer.testing import CliRunner

    from vpatch.commands.cli import app

    args = [a for ref in against for a in ("--against", ref)]
    result = CliRunner().invoke(app, ["--project", str(root), "status", "--json", "--exit-code", *args])
    return result.exit_code, {p["slug"]: p for p in json.loads(result.stdout)["patches"]}


def moved(cell: dict) -> list[dict]:  # type: ignore[type-arg]
    return [e for e in cell["evidence"] if e["kind"] == "moved"]


def test_each_kind_of_code_move_gets_its_verdict(tmp_path: Path, history: History) -> None:
    c = history.commits
    root = make_project(tmp_path, history, ["split", "gamma-fix", "parse", "dup", "nv"])
    code, rows = status(root, "v1.1.1", "v1.2.0")
    assert code == 4  # the duplicated code: a person must choose

    # the file cut into three, git pairing the old name with the piece that holds alpha: the beta hunk follows its
    # code to beta.py, the alpha hunk stays with git's pairing: a patch on two files, needed and applying cleanly
    split = rows["split"]["results"]["v1.2.0"]
    assert split["state"] == "needed" and split["applies"] == "clean", split
    file_move, hunk_move = moved(split)
    assert file_move["detail"].startswith("vllm/engine.py -> vllm/engine/core.py (similarity ")
    assert hunk_move["says"] == "neutral", hunk_move
    # the whole pre-image exactly (80 of 100), most of its surroundings (gamma's first lines went elsewhere)
    assert hunk_move["detail"].startswith("vllm/engine.py hunk 2 (@@ -70,7 +70,7 @@) -> vllm/engine/beta.py line 6 "
                                          "(score 97%, the code moved in " + c["split"][:12]), hunk_move
    assert '"[Refactor] Split the engine (#301)" (release v1.1.1)' in hunk_move["detail"]
    (hm,) = split["hunk_moves"]
    assert (hm["old"], hm["hunk"], hm["at"], hm["new"]) == ("vllm/engine.py", 2, "vllm/engine/core.py",
                                                            "vllm/engine/beta.py")
    assert "vllm/engine.py #2 moved to vllm/engine/beta.py" in split["summary"]

    # the same split cherry-picked onto the release branch: on v1.1.1 the cherry-pick moved it
    on_branch = rows["split"]["results"]["v1.1.1"]
    assert on_branch["state"] == "needed", on_branch
    assert f"the code moved in {c['split-pick'][:12]}" in moved(on_branch)[1]["detail"]
    assert "(release v1.1.1)" in moved(on_branch)[1]["detail"]

    # upstream's own change, released with the split: landed at the new place (reverse-applies there)
    fix = rows["gamma-fix"]["results"]["v1.2.0"]
    assert fix["state"] == "landed" and fix["decided_by"] == "reverse-apply", fix
    assert "vllm/engine/gamma.py" in moved(fix)[-1]["detail"]
    assert rows["gamma-fix"]["results"]["v1.0.0"]["state"] == "needed"

    # a function moved to an existing other file: the old file is still there, the hunk follows the code
    parse = rows["parse"]["results"]["v1.2.0"]
    assert parse["state"] == "needed" and parse["applies"] == "clean", parse
    (ev,) = moved(parse)
    assert ev["detail"].startswith("vllm/utils.py hunk 1 (@@ -28,7 +28,7 @@) -> vllm/config.py line 28 ")
    assert f"in {c['parse-move'][:12]}" in ev["detail"] and "(in no release yet)" not in ev["detail"]
    assert "(release v1.2.0)" in ev["detail"]
    assert rows["parse"]["results"]["v1.1.1"]["state"] == "needed" and not moved(rows["parse"]["results"]["v1.1.1"])

    # the code in two new files: never a guess, both named with their scores
    dup = rows["dup"]["results"]["v1.2.0"]
    assert dup["state"] == "conflict" and dup["decided_by"] == "moved", dup
    (ev,) = moved(dup)
    assert ev["says"] == "unavailable" and "vllm/x/dup.py 96%, vllm/y/dup.py 96%" in ev["detail"]
    assert ev["detail"].endswith("no clear winner, not guessed, a person must choose"), ev
    assert "a person must choose" in dup["summary"]

    # copies are not moves: the AMD copy held the old code at the pin already (no candidate at all), and the new
    # file that has the change made in it is no landing while the file the patch fixes stands: never landed
    nv = rows["nv"]["results"]["v1.2.0"]
    assert nv["state"] == "conflict" and nv["decided_by"] == "moved", nv
    (ev,) = moved(nv)
    assert ev["says"] == "unavailable" and "vllm/amd/model.py" not in ev["detail"], ev
    assert "candidates vllm/next/model.py 100% (already changed)" in ev["detail"], ev
    assert rows["nv"]["landed_in"] is None


def test_relocation_runs_only_for_hunks_that_need_it_and_is_cached(
        tmp_path: Path, history: History, monkeypatch: pytest.MonkeyPatch) -> None:
    from vpatch import git as vgit

    root = make_project(tmp_path, history, ["split", "parse"])
    repo = mirror.mirror_path(cache_dir(), history.url)
    series = Series.load(root / "patches")
    pin, tip = history.commits["base"], history.commits["v1.2.0"]
    searched: list[str] = []
    real = vgit.files_containing

    def counting(*args: object, **kwargs: object) -> dict[str, set[bytes]]:
        searched.append("grep")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(vgit, "files_containing", counting)
    # on the pin nothing is searched: every hunk applies where it is
    assert {v.state for v in verdict.judge_series(repo, series.patches, pin, pin=pin, history=True)} == {
        verdict.State.NEEDED}
    assert searched == []
    first = verdict.judge_series(repo, series.patches, tip, pin=pin, history=True)
    # one walk of the tree per patch that has hunks to find (the beta hunk, the parse_flags hunk), nothing else
    assert searched == ["grep", "grep"]
    assert [(m.old, m.hunk) for v in first for m in v.hunk_moves] == [("vllm/engine.py", 2), ("vllm/utils.py", 1)]
    # a second process (the cache read back from disk) searches nothing
    commitcache.reset()
    assert verdict.judge_series(repo, series.patches, tip, pin=pin, history=True) == first
    assert searched == ["grep", "grep"]


def test_update_carries_the_hunks_where_the_relocation_is_exact_and_apply_ref_follows(
        tmp_path: Path, history: History) -> None:
    # behavioural, wherever the code lives: the local call is somewhere in the package
    probe = 'kind: command\nrun: ["{python}", "{probe_dir}/beta.py"]\ntimeout: 60\n'
    root = make_project(tmp_path, history, ["split", "parse"], probes={"split": probe})
    # apply onto the new release follows the code, and export writes the patch on the new files
    code, out = vpatch(root, "apply", "--ref", "v1.2.0")
    assert code == 0, out
    tree = root / ".vpatch" / "tree"
    assert "run_beta(state, 8, local=True)" in (tree / "vllm/engine/beta.py").read_text()
    assert "run_alpha(state, 30, local=True)" in (tree / "vllm/engine/core.py").read_text()
    assert "run_parse_flags(state, 6, local=True)" in (tree / "vllm/config.py").read_text()

    # `git am -3` of either old patch cannot place code moved to another file; each relocation is exact: carried,
    # `parse` without a probe, `split` proven by the same (its probe re-validated as for every kept patch)
    code, out = vpatch(root, "update", "--to", "v1.2.0")
    assert code == 0, out
    assert "moved: vllm/engine.py hunk 2 (@@ -70,7 +70,7 @@) -> vllm/engine/beta.py line 6" in out
    assert ("proof: `git am -3` of the old patch cannot place code that moved to another file; the relocation is "
            "exact: vllm/engine.py hunk 2 -> vllm/engine/beta.py line 6, each hunk's whole pre-image (context and "
            "removed lines, byte for byte) at exactly one place there and replaced by its post-image, the rest of the "
            "patch by `git am -3`, gives the re-targeted patch's tree ") in out, out
    assert "the relocation is exact: vllm/utils.py hunk 1 -> vllm/config.py line 28, " in out
    patch = (root / "patches" / "0001-split.patch").read_text()
    assert "diff --git a/vllm/engine/core.py b/vllm/engine/core.py" in patch
    assert "diff --git a/vllm/engine/beta.py b/vllm/engine/beta.py" in patch and "vllm/engine.py" not in patch
    assert "diff --git a/vllm/config.py b/vllm/config.py" in (root / "patches" / "0002-parse.patch").read_text()
    message = git(root, "log", "-1", "--format=%B")
    assert "Re-targeted: upstream moved vllm/engine.py hunk 2" in message
    assert "Proof: `git am -3` of the old patch cannot place code that moved to another file; the relocation is " \
           "exact: vllm/utils.py hunk 1 -> vllm/config.py line 28" in message, message
    code, rows = status(root)
    for name in ("split", "parse"):
        cell = rows[name]["results"]["v1.2.0"]
        assert code == 0 and cell["state"] == "needed" and cell["applies"] == "clean" and not moved(cell), cell


def test_a_relocation_that_is_not_exact_stops_the_update_where_no_probe_proves_it(
        tmp_path: Path, history: History) -> None:
    """The search ran on the release; the proof runs where the patch goes, after the patches before it: there an
    earlier patch put a copy of the code the beta hunk changes into beta.py, so its pre-image is at two places and
    the relocation is not taken on trust (git apply put the hunk at one of them: nothing says it is the right one)."""
    root = make_project(tmp_path, history, ["beta-copy", "beta"])
    code, rows = status(root, "v1.2.0")
    cell = rows["beta"]["results"]["v1.2.0"]
    assert cell["state"] == "needed" and cell["hunk_moves"][0]["new"] == "vllm/engine/beta.py", cell
    code, out = vpatch(root, "update", "--to", "v1.2.0")
    assert code != 0, out
    assert ("0002-beta.patch was re-targeted where upstream moved its code (hunks to another file), but `git am -3` "
            "of the old patch cannot apply there, the relocation is not exact (vllm/engine.py hunk 1 -> "
            "vllm/engine/beta.py: its whole pre-image (context and removed lines) is at 2 places of it (lines 6, 17)),"
            " and the patch has no probe to prove the result; the project is unchanged") in " ".join(out.split()), out
    assert git(root, "status", "--porcelain", "--", "patches", "vpatch.yaml") == ""
    assert len(git(root, "log", "--format=%H").split()) == 1


def test_a_files_probe_follows_its_strings_to_where_each_hunk_went(tmp_path: Path, history: History) -> None:
    """split's probe names the file the pin has: its alpha string stays with the hunk git's pairing took to
    core.py, its beta strings follow the beta hunk to beta.py; validated there, written so."""
    probe = ("kind: files\nfiles:\n  vllm/engine.py:\n    contains: ['run_alpha(state, 30, local=True)', "
             "'run_beta(state, 8, local=True)']\n    not_contains: [\"run_beta(state, 8)\\n\"]\n")
    root = make_project(tmp_path, history, ["split"], probes={"split": probe})
    code, out = vpatch(root, "update", "--to", "v1.2.0")
    assert code == 0, out
    assert "probe check probes/split.yaml: vllm/engine.py -> vllm/engine/beta.py, its strings followed hunk 2" in out
    assert "probe check probes/split.yaml: vllm/engine.py -> vllm/engine/core.py, the file moved (similarity " in out
    assert "re-validated on v1.2.0: split.yaml fails without the patch and passes with it" in out, out
    from vpatch.probes import Probe

    written = Probe.load(root / "patches" / "probes" / "split.yaml")
    assert {c.path: (c.contains, c.not_contains) for c in written.files} == {
        "vllm/engine/core.py": (("run_alpha(state, 30, local=True)",), ()),
        "vllm/engine/beta.py": (("run_beta(state, 8, local=True)",), ("run_beta(state, 8)\n",)),
    }
    message = git(root, "log", "-1", "--format=%B")
    assert "Probe followed: probe check probes/split.yaml: vllm/engine.py -> vllm/engine/beta.py" in message
    assert "- patches/probes/split.yaml" in message
    code, rows = status(root)
    cell = rows["split"]["results"]["v1.2.0"]
    assert code == 0 and cell["state"] == "needed", cell
    assert any(e["kind"] == "probe" and e["says"] == "not-landed" for e in cell["evidence"]), cell


def test_a_hunk_in_one_half_of_a_split_follows_it(tmp_path: Path, history: History) -> None:
    """The search alone: a hunk put where git pairs its file (core.py) found whole in one other file, scored there."""
    repo = history.path
    pin, tip = history.commits["base"], history.commits["v1.2.0"]
    root = make_project(tmp_path, history, ["gamma-local"])
    patch = Series.load(root / "patches").patches[0]
    fd = patch.files[0]
    ask = hunkmoves.Ask("vllm/engine.py", 1, fd.hunks[0], "vllm/engine/core.py")
    found = hunkmoves.relocate(repo, pin, tip, [ask])[("vllm/engine.py", 1)]
    # 80 for the whole pre-image, 17 of 20 for its surroundings: 6 of the 7 lines around it are around it there
    # (upstream changed gamma's step 3 in the split)
    assert found.new == "vllm/engine/gamma.py" and found.winner is not None and found.winner.score == 97, found
    assert [c.path for c in found.candidates] == ["vllm/engine/gamma.py"], found  # nothing else comes near
    moved_patch = hunkmoves.relocated(patch, patch, hunkmoves.plan({("vllm/engine.py", 1): found}))
    assert moved_patch.paths == ("vllm/engine/gamma.py",)
    assert moved_patch.files[0].hunks[0].header.startswith(f"@@ -{found.winner.line},7 +{found.winner.line},7 @@")


def test_upstreams_own_change_at_the_new_place_lands_there_is_dropped_and_a_partial_is_narrowed_there(
        tmp_path: Path, history: History) -> None:
    """After the split, upstream makes the beta change itself in beta.py (#305, v1.3.0): a patch carrying it
    reverse-applies at the new place (landed, also by the re-targeted patch's patch-id) and is dropped, as is
    upstream's gamma fix released with the split; the split patch (alpha + beta) is partial there and narrowed
    to its alpha hunk at core.py."""
    git(history.path, "checkout", "-q", "main")
    landing = _commit(history.path, "[Engine] Beta step 8 is local (#305)",
                      {"vllm/engine/beta.py": local(BETA, "beta", 8)})
    git(history.path, "tag", "v1.3.0")
    root = make_project(tmp_path, history, ["beta", "gamma-fix"])
    code, rows = status(root, "v1.3.0")
    assert code == 3, rows  # landed
    beta = rows["beta"]["results"]["v1.3.0"]
    assert beta["state"] == "landed" and beta["decided_by"] == "reverse-apply", beta
    patch_id = next(e for e in beta["evidence"] if e["kind"] == "patch-id")
    assert patch_id["says"] == "landed" and landing[:12] in patch_id["detail"], patch_id
    assert patch_id["detail"].endswith("(the patch at the places its code moved to)"), patch_id
    assert "line 6" in moved(beta)[-1]["detail"] and "vllm/engine/beta.py" in moved(beta)[-1]["detail"]
    code, out = vpatch(root, "update", "--to", "v1.3.0")
    assert code == 0, out
    assert not list((root / "patches").glob("*.patch")), out
    message = git(root, "log", "-1", "--format=%B")
    assert message.splitlines()[0] == "Update upstream pin v1.0.0 -> v1.3.0: drop 0001, 0002", message

    (tmp_path / "partial").mkdir()
    probe = 'kind: command\nrun: ["{python}", "{probe_dir}/alpha.py"]\ntimeout: 60\n'
    root = make_project(tmp_path / "partial", history, ["split"], probes={"split": probe})
    code, rows = status(root, "v1.3.0")
    split = rows["split"]["results"]["v1.3.0"]
    assert split["state"] == "partial", split
    # the beta hunk is this patch's second (the answer cached from the other project, where it was the first)
    assert moved(split)[-1]["detail"].startswith("vllm/engine.py hunk 2 (@@ -70,7 +70,7 @@) -> vllm/engine/beta.py")
    assert split["hunks"]["landed"] == ["vllm/engine/beta.py hunk 1 (@@ -6,7 +6,7 @@)"], split["hunks"]
    assert split["hunks"]["needed"] == ["vllm/engine/core.py hunk 1 (@@ -28,7 +28,7 @@)"], split["hunks"]
    code, out = vpatch(root, "update", "--to", "v1.3.0")
    assert code == 0, out
    message = git(root, "log", "-1", "--format=%B")
    assert message.splitlines()[0] == "Update upstream pin v1.0.0 -> v1.3.0: narrow 0001", message
    patch = (root / "patches" / "0001-split.patch").read_text()
    assert "diff --git a/vllm/engine/core.py b/vllm/engine/core.py" in patch and "vllm/engine/beta.py" not in patch
    assert "run_alpha(state, 30, local=True)" in patch


def test_on_a_partial_mirror_the_search_fetches_the_tree_in_one_request(tmp_path: Path, history: History) -> None:
    """A partial mirror (blob:none) lacks the target's files: git grep alone would fetch each one by one."""
    from vpatch import git as vgit

    git(history.path, "config", "uploadpack.allowFilter", "true")
    root = make_project(tmp_path, history, ["parse"])
    shutil.rmtree(mirror.mirror_path(cache_dir(), history.url))
    repo = mirror.fetch(cache_dir(), history.url, blob_filter="blob:none")
    # upstream reached through an upload-pack that writes one line per request it serves (each lazy fetch is one)
    served = tmp_path / "upload-pack.log"
    wrapper = tmp_path / "upload-pack.sh"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> "{served}"\nexec git upload-pack "$@"\n')
    wrapper.chmod(0o755)
    git(repo, "config", "remote.origin.uploadpack", str(wrapper))
    tip = history.commits["v1.2.0"]
    assert len(vgit.missing_blobs(repo, [tip], None)) > 5
    code, rows = status(root, "v1.2.0")
    assert code == 0 and rows["parse"]["results"]["v1.2.0"]["state"] == "needed", rows
    assert moved(rows["parse"]["results"]["v1.2.0"])[0]["detail"].startswith("vllm/utils.py hunk 1")
    assert vgit.missing_blobs(repo, [tip], None) == []
    # status's own prefetch of the patch's files, then one for the tree the search reads: never one per file
    assert len(served.read_text().splitlines()) <= 3, served.read_text()


def test_code_changed_where_it_is_while_a_new_copy_has_the_old_code_is_not_followed(
        tmp_path: Path, history: History) -> None:
    """Upstream changes helper's step 10 in utils.py (#306) and adds a new file with a copy of the old helper: the
    hunk's own file still holds most of its code, so it is judged there as before, never moved to the copy."""
    git(history.path, "checkout", "-q", "main")
    changed = HELPERS.replace("    helper_step_10 = run_helper(state, 10)\n", "    helper_step_10 = run_helper(state, 10) + 1\n")
    _commit(history.path, "[Utils] Change helper step 10, keep the old helper for plugins (#306)",
            {"vllm/utils.py": changed, "vllm/plugins/old_helper.py": HELPERS})
    git(history.path, "tag", "v1.4.0")
    root = make_project(tmp_path, history, ["helper"])
    code, rows = status(root, "v1.4.0")
    cell = rows["helper"]["results"]["v1.4.0"]
    assert cell["state"] == "conflict" and cell["hunk_moves"] == [] and not moved(cell), cell
    assert cell["hunks"]["conflict"] == ["vllm/utils.py hunk 1 (@@ -8,7 +8,7 @@)"], cell["hunks"]
    assert code == 4
