"""Release branches, cherry-picks, reverts and disagreeing evidence, on a real git history shaped like vLLM's:
squash commits "(#N)" on main, releases/vX.Y branches tagged vX.Y.Z, fixes cherry-picked onto them with -x,
PRs reverted ('Revert "... (#N)" (#M)', "This reverts commit <sha>.") and re-landed ('Reapply "..."')."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import KV_V1, PARSER_V1, git, patch_of_head, vpatch_json, write_config
from conftest import vpatch_cli as vpatch

from vpatch.base.paths import cache_dir
from vpatch.config.project import Config
from vpatch.series.files import Series
from vpatch.upstream import lineage, mirror

SCHED = "".join(f"s {i}\n" for i in range(1, 21))
TOOL = "".join(f"t {i}\n" for i in range(1, 21))
MISC = "".join(f"m {i}\n" for i in range(1, 21))
FIXES = {
    "kv": ("vllm/kv.py", KV_V1, KV_V1.replace("break", "continue")),
    "parser": ("vllm/parser.py", PARSER_V1, PARSER_V1.replace("line 20\n", "line 20 fixed\n")),
    "sched": ("vllm/sched.py", SCHED, SCHED.replace("s 5\n", "s 5 fixed\n")),
    "tool": ("vllm/tool.py", TOOL, TOOL.replace("t 7\n", "t 7 fixed\n")),
    "misc": ("vllm/misc.py", MISC, MISC.replace("m 3\n", "m 3 fixed\n")),
}


@dataclass
class History:
    path: Path
    commits: dict[str, str]  # name -> sha

    @property
    def url(self) -> str:
        return self.path.as_uri()


_clock = itertools.count()


def _tick() -> None:
    """Each upstream commit an hour after the last, as on a real main branch (dates order the targets)."""
    stamp = 1788220800 + 3600 * next(_clock)
    for var in ("GIT_AUTHOR_DATE", "GIT_COMMITTER_DATE"):
        os.environ[var] = f"{stamp} +0000"


def _commit(path: Path, message: str, files: dict[str, str] | None = None) -> str:
    for name, content in (files or {}).items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(content)
    git(path, "add", "-A")
    _tick()
    git(path, "commit", "-q", "--allow-empty", "-m", message)
    return git(path, "rev-parse", "HEAD").strip()


def _revert(path: Path, sha: str, subject: str) -> str:
    git(path, "revert", "--no-commit", sha)
    return _commit(path, f"{subject}\n\nThis reverts commit {sha}.\n")


def _fixed(name: str) -> dict[str, str]:
    path, _, after = FIXES[name]
    return {path: after}


@pytest.fixture
def vllm_like(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> History:
    """main: base -> #101 kv -> #102 parser -> revert #103 -> #104 sched -> revert #105 -> reapply #106
    -> #109 (names a PR whose content never came) -> [releases/v1.1 forks] -> #107 tool -> #108 -> [releases/v1.2
    forks, tagged v1.2.0] -> #110.
    releases/v1.0: version bump tagged v1.0.0. releases/v1.1: bump tagged v1.1.0, cherry-pick -x of #107 tagged v1.1.1."""
    for var in ("GIT_AUTHOR_DATE", "GIT_COMMITTER_DATE"):
        monkeypatch.setenv(var, os.environ[var])  # restored after the test
    path = tmp_path / "vllm"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    c: dict[str, str] = {}
    c["base"] = _commit(path, "Initial", {p: before for p, before, _ in FIXES.values()} | {"README": "vllm\n"})
    git(path, "checkout", "-q", "-b", "releases/v1.0")
    c["v1.0.0"] = _commit(path, "Bump version to 1.0.0", {"VERSION": "1.0.0\n"})
    git(path, "tag", "v1.0.0")
    git(path, "checkout", "-q", "main")
    c["kv"] = _commit(path, "[Core] Free blocks past null gaps (#101)", _fixed("kv"))
    c["parser"] = _commit(path, "[Parser] Fix the parser (#102)", _fixed("parser"))
    c["parser-revert"] = _revert(path, c["parser"], 'Revert "[Parser] Fix the parser (#102)" (#103)')
    c["sched"] = _commit(path, "[Sched] Fix the scheduler (#104)", _fixed("sched"))
    c["sched-revert"] = _revert(path, c["sched"], 'Revert "[Sched] Fix the scheduler (#104)" (#105)')
    c["sched-reland"] = _revert(path, c["sched-revert"], 'Reapply "[Sched] Fix the scheduler (#104)" (#106)')
    c["misc-pr"] = _commit(path, "[Misc] Tidy the README (#109)", {"README": "vllm, tidied\n"})
    c["fork"] = c["misc-pr"]
    git(path, "checkout", "-q", "-b", "releases/v1.1")
    c["v1.1.0"] = _commit(path, "Bump version to 1.1.0", {"VERSION": "1.1.0\n"})
    git(path, "tag", "v1.1.0")
    git(path, "checkout", "-q", "main")
    c["tool"] = _commit(path, "[Tool] Fix tool parsing (#107)", _fixed("tool"))
    c["later"] = _commit(path, "[Misc] Something else (#108)", {"README": "vllm, later\n"})
    git(path, "checkout", "-q", "releases/v1.1")
    _tick()
    git(path, "cherry-pick", "-x", c["tool"])
    c["tool-pick"] = git(path, "rev-parse", "HEAD").strip()
    c["v1.1.1"] = _commit(path, "Bump version to 1.1.1", {"VERSION": "1.1.1\n"})
    git(path, "tag", "v1.1.1")
    git(path, "checkout", "-q", "main")
    git(path, "checkout", "-q", "-b", "releases/v1.2")
    c["v1.2.0"] = _commit(path, "Bump version to 1.2.0", {"VERSION": "1.2.0\n"})
    git(path, "tag", "v1.2.0")
    git(path, "checkout", "-q", "main")
    c["tip"] = _commit(path, "[Docs] Keep main moving (#110)", {"README": "vllm, main\n"})
    _tick()  # the project's own commits come after upstream's
    return History(path, c)


def make_project(root: Path, history: History, names: list[str], prs: dict[str, int]) -> Path:
    """A project pinned at v1.0.0 whose patches make FIXES[name] on v1.0.0, committed in its own repository."""
    (root / "patches").mkdir(parents=True)
    write_config(root, history.url, ref="v1.0.0")
    scratch = root.parent / f"{root.name}-scratch"
    git(root.parent, "clone", "-q", str(history.path), str(scratch))
    for number, name in enumerate(names, 1):
        git(scratch, "checkout", "-q", "--detach", "v1.0.0")
        path, _, after = FIXES[name]
        (scratch / path).write_text(after)
        trailers = "Origin: vendor\n" + (f"Upstream-PR: {prs[name]}\n" if name in prs else "") + "Last-Update: 2026-09-01"
        _commit(scratch, f"Fix {name}\n\nWhy this change exists.\n\n{trailers}\n")
        raw = patch_of_head(scratch)
        (root / "patches" / f"{number:04d}-{name}.patch").write_text(raw)
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "project")
    mirror.fetch(cache_dir(), history.url)
    return root


PRS = {"kv": 101, "parser": 102, "sched": 104, "tool": 107, "misc": 109}


@pytest.fixture
def project(tmp_path: Path, vllm_like: History) -> Path:
    return make_project(tmp_path / "project", vllm_like, ["kv", "parser", "sched", "tool"], PRS)


def status_json(root: Path, *against: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    args = [a for ref in against for a in ("--against", ref)]
    code, doc = vpatch_json(root, "status", "--json", "--exit-code", *args)
    return code, doc


def by_slug(doc: dict, slug: str) -> dict:  # type: ignore[type-arg]
    return next(p for p in doc["patches"] if p["slug"] == slug)


def test_update_to_a_newer_release_tag_on_another_release_branch_needs_no_flag(project: Path, vllm_like: History) -> None:
    code, out = vpatch(project, "update", "--to", "v1.1.1")
    assert code == 0, out
    assert sorted(p.name for p in (project / "patches").glob("*.patch")) == ["0002-parser.patch"]
    message = git(project, "log", "-1", "--format=%B")
    assert message.startswith("Update upstream pin v1.0.0 -> v1.1.1: drop 0001, 0003, 0004")
    # the reverted parser fix is kept: needed, with the revert as evidence
    assert "- 0002-parser.patch: needed" in message
    assert Config.load(project).pin.ref == "v1.1.1"
    retired = (project / "patches" / "RETIRED.md").read_text()
    pick = vllm_like.commits["tool-pick"][:12]
    # one release, the first that has it, and the cherry-pick that puts it there
    assert f"Applied-Upstream: v1.1.1 (first commit {pick}; in it as v1.1.1 ({pick} on " \
           f"releases/v1.1, cherry-picked from {vllm_like.commits['tool'][:12]}))" in retired


def test_a_real_downgrade_still_needs_the_flag_and_says_why(project: Path) -> None:
    code, out = vpatch(project, "update", "--to", "v1.1.1")
    assert code == 0, out
    code, out = vpatch(project, "update", "--to", "v1.1.0", "--dry-run")
    assert code == 1 and "v1.1.0 is not newer than the pin v1.1.1" in out and "lower release" in out
    assert "--allow-downgrade" in out
    code, out = vpatch(project, "update", "--to", "v1.0.0", "--dry-run")
    assert code == 1 and "before the pin v1.1.1 does" in out
    assert vpatch(project, "update", "--to", "v1.0.0", "--dry-run", "--allow-downgrade")[0] == 0


def test_direction_between_refs(vllm_like: History) -> None:
    c, repo = vllm_like.commits, vllm_like.path

    def way(a: str, b: str) -> bool:
        return lineage.direction(repo, current=git(repo, "rev-parse", a).strip(), current_ref=a,
                                 target=git(repo, "rev-parse", b).strip(), target_ref=b, branch="main").forward

    assert way("v1.0.0", "v1.1.1") and way("v1.1.0", "v1.1.1") and way("v1.1.1", "v1.2.0")
    assert way("v1.0.0", "main") and way(c["kv"], "v1.1.0")
    assert not way("v1.1.1", "v1.1.0") and not way("v1.2.0", "v1.1.1") and not way("v1.1.1", "v1.0.0")
    # main past the fork has commits v1.1.1 lacks (#108): moving there from main is no upgrade
    assert not way("main", "v1.1.1")


def test_first_release_is_the_release_branch_tag_carrying_the_cherry_pick(project: Path, vllm_like: History) -> None:
    c = vllm_like.commits
    code, doc = status_json(project, "v1.1.1", "main")
    tool = by_slug(doc, "tool")["landed_in"]
    # first landed on the v1.1.1 target: bisected on the release branch itself (main at the fork lacks it)
    assert code == 3  # some patch landed; nothing partial, conflicting or disputed
    assert (tool["ref"], tool["commit"], tool["release"]) == ("v1.1.1", c["tool-pick"], "v1.1.1")
    assert tool["release_proof"] == {"commit": c["tool-pick"], "branch": "releases/v1.1", "cherry_pick": False,
                                     "cherry_picked_from": c["tool"]}
    # #101 reached v1.1.0 on main before the fork: bisected on main between the merge-bases
    kv = by_slug(doc, "kv")["landed_in"]
    assert kv["commit"] == c["kv"] and kv["release"] == "v1.1.0" and kv["bisected"]
    assert kv["release_proof"] == {"commit": c["kv"], "branch": "main", "cherry_pick": False, "cherry_picked_from": None}

    # judged on main only: the landing is #107 on main; its first release is v1.1.1 through the
    # cherry-pick on releases/v1.1, not v1.2.0 (the first tag that contains #107 itself)
    _, doc = status_json(project, "main")
    tool = by_slug(doc, "tool")["landed_in"]
    assert tool["commit"] == c["tool"] and tool["release"] == "v1.1.1"
    assert tool["release_proof"] == {"commit": c["tool-pick"], "branch": "releases/v1.1", "cherry_pick": True,
                                     "cherry_picked_from": None}


def test_a_reverted_landing_is_not_landed_and_the_revert_is_evidence(project: Path, vllm_like: History) -> None:
    c = vllm_like.commits
    _, doc = status_json(project, "v1.1.1")
    parser = by_slug(doc, "parser")
    verdict = parser["results"]["v1.1.1"]
    assert verdict["state"] == "needed" and parser["landed_in"] is None
    evidence = {e["kind"]: e for e in verdict["evidence"]}
    assert evidence["revert"]["says"] == "not-landed"
    assert f"reverted in {c['parser-revert'][:12]}" in evidence["revert"]["detail"]
    assert evidence["upstream-pr"]["says"] == "not-landed" and "but reverted since" in evidence["upstream-pr"]["detail"]
    assert evidence["patch-id"]["says"] == "not-landed"
    assert "reverted upstream" in verdict["summary"]


def test_a_re_landed_change_lands_at_the_re_land(project: Path, vllm_like: History) -> None:
    c = vllm_like.commits
    _, doc = status_json(project, "v1.1.1")
    sched = by_slug(doc, "sched")
    assert sched["results"]["v1.1.1"]["state"] == "landed"
    assert sched["landed_in"]["commit"] == c["sched-reland"]
    assert sched["landed_in"]["release"] == "v1.1.0"
    revert = next(e for e in sched["results"]["v1.1.1"]["evidence"] if e["kind"] == "revert")
    assert revert["says"] == "landed" and f"re-landed in {c['sched-reland'][:12]}" in revert["detail"]


def test_identity_says_landed_content_says_not_is_disputed_never_dropped(tmp_path: Path, vllm_like: History) -> None:
    root = make_project(tmp_path / "disputed", vllm_like, ["misc"], PRS)
    code, doc = status_json(root, "v1.1.1")
    misc = by_slug(doc, "misc")["results"]["v1.1.1"]
    assert misc["state"] == "disputed" and code == 4
    assert misc["decided_by"] == "disagreement"
    assert "#109" in misc["summary"]
    code, out = vpatch(root, "status", "--against", "v1.1.1")
    assert "disputed" in out and "identity says landed" in out

    head = git(root, "rev-parse", "HEAD")
    code, out = vpatch(root, "update", "--to", "v1.1.1")
    assert code == 5, out
    assert "stopped at 0001-misc.patch" in out and "disputed" in out and "a person must look" in out
    assert git(root, "rev-parse", "HEAD") == head
    assert (root / "patches" / "0001-misc.patch").exists()
    # --continue keeps the patch (the person decided it is still needed)
    code, out = vpatch(root, "update", "--continue")
    assert code == 0, out
    assert [p.filename for p in Series.load(root / "patches")] == ["0001-misc.patch"]
    assert Config.load(root).pin.ref == "v1.1.1"
