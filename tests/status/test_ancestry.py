"""Targets ordered and bisections based by the commit graph, never by commit dates: a history whose commits are
dated before the pin (back-dated, or a skewed clock), and a patch release vX.Y.1 cut after the next minor
vX.(Y+1).0 with a cherry-pick dated before the commit it picks. Real git repositories in tmp_path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import KV_V1, PARSER_V1, git, patch_of_head, vpatch_json, write_config

from vpatch.base.paths import cache_dir
from vpatch.upstream import lineage, mirror

KV_FIXED = KV_V1.replace("break", "continue")
PARSER_FIXED = PARSER_V1.replace("line 20\n", "line 20 fixed\n")
PIN_DATE = 1788220800  # 2026-09-01


class Upstream:
    """A non-bare upstream whose every commit gets the date it is given."""

    def __init__(self, path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.path, self.monkeypatch = path, monkeypatch
        path.mkdir()
        git(path, "init", "-q", "-b", "main")

    def commit(self, message: str, files: dict[str, str], *, date: int) -> str:
        for name, content in files.items():
            (self.path / name).parent.mkdir(parents=True, exist_ok=True)
            (self.path / name).write_text(content)
        git(self.path, "add", "-A")
        self.date(date)
        git(self.path, "commit", "-q", "--allow-empty", "-m", message)
        return git(self.path, "rev-parse", "HEAD").strip()

    def date(self, stamp: int) -> None:
        for var in ("GIT_AUTHOR_DATE", "GIT_COMMITTER_DATE"):
            self.monkeypatch.setenv(var, f"{stamp} +0000")

    def pick(self, commit: str, *, date: int) -> str:
        self.date(date)
        git(self.path, "cherry-pick", "-x", commit)
        return git(self.path, "rev-parse", "HEAD").strip()


def make_project(root: Path, up: Upstream, pin: str, fixes: dict[str, tuple[str, str, int]]) -> Path:
    """A project pinned at `pin` with one patch per fix (slug -> (path, fixed content, upstream PR))."""
    (root / "patches").mkdir(parents=True)
    write_config(root, up.path.as_uri(), ref=pin)
    scratch = root.parent / f"{root.name}-scratch"
    git(root.parent, "clone", "-q", str(up.path), str(scratch))
    for number, (slug, (path, content, pr)) in enumerate(fixes.items(), 1):
        git(scratch, "checkout", "-q", "--detach", pin)
        (scratch / path).write_text(content)
        git(scratch, "commit", "-q", "-am", f"Fix {slug}\n\nWhy.\n\nOrigin: vendor\nUpstream-PR: {pr}\nLast-Update: 2026-09-01\n")
        raw = patch_of_head(scratch)
        (root / "patches" / f"{number:04d}-{slug}.patch").write_text(raw)
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "project")
    mirror.fetch(cache_dir(), up.path.as_uri())
    return root


def status(root: Path, *against: str) -> dict:  # type: ignore[type-arg]
    code, doc = vpatch_json(root, "status", "--json", "--no-probes", *(a for ref in against for a in ("--against", ref)))
    assert code in (0, 3), doc
    return doc  # type: ignore[no-any-return]


def landing(doc: dict, slug: str) -> dict:  # type: ignore[type-arg]
    found = next(p for p in doc["patches"] if p["slug"] == slug)["landed_in"]
    assert found is not None, f"{slug} not landed"
    return found  # type: ignore[no-any-return]


@pytest.fixture(autouse=True)
def _restore_dates(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("GIT_AUTHOR_DATE", "GIT_COMMITTER_DATE"):
        monkeypatch.setenv(var, os.environ[var])


def test_a_history_dated_before_the_pin_is_ordered_and_bisected_by_ancestry(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The pin is a main commit (a nightly); every later commit carries a date before it, newest oldest."""
    up = Upstream(tmp_path / "vllm", monkeypatch)
    up.commit("Initial", {"vllm/kv.py": KV_V1, "vllm/parser.py": PARSER_V1, "README": "vllm\n"}, date=PIN_DATE)
    git(up.path, "tag", "v1.0.0")
    shas: dict[int, str] = {}
    for i in range(1, 41):
        files = {"vllm/kv.py": KV_FIXED} if i == 25 else {f"vllm/mod{i % 7}.py": f"VALUE = {i}\n"}
        shas[i] = up.commit(f"[Misc] Change {i} (#{100 + i})", files, date=PIN_DATE - 3600 * i)
        if i == 30:
            git(up.path, "checkout", "-q", "-b", "releases/v1.1")
            shas[-1] = up.commit("Bump version to 1.1.0", {"VERSION": "1.1.0\n"}, date=PIN_DATE - 10**6)
            git(up.path, "tag", "v1.1.0")
            git(up.path, "checkout", "-q", "main")
    root = make_project(tmp_path / "project", up, "v1.0.0", {"kv": ("vllm/kv.py", KV_FIXED, 125)})

    doc = status(root, "v1.1.0", "main")
    assert doc["targets"] == ["v1.0.0", "v1.1.0", "main"]
    kv = landing(doc, "kv")
    assert (kv["ref"], kv["since"], kv["commit"], kv["release"]) == ("v1.1.0", "v1.0.0", shas[25], "v1.1.0")
    assert kv["bisected"] and kv["candidates"] == 30

    # the pin is the baseline of main too, when main is the only target
    kv = landing(status(root, "main"), "kv")
    assert (kv["ref"], kv["since"], kv["commit"], kv["release"]) == ("main", "v1.0.0", shas[25], "v1.1.0")
    assert kv["candidates"] == 40


@pytest.mark.parametrize("clock", ["true", "skewed"])
def test_a_patch_release_cut_after_the_next_minor_comes_before_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   clock: str) -> None:
    """main: base -> #201 -> [releases/v1.1: v1.1.0] -> #202 kv fix -> #203 parser fix -> [releases/v1.2: v1.2.0]
    -> #204. After v1.2.0, #202 is cherry-picked onto releases/v1.1 and v1.1.1 is tagged: v1.1.1 is the first
    release with the kv fix. "true": dated a week after v1.2.0; "skewed": the pick and v1.1.1 dated before
    #202 itself."""
    up = Upstream(tmp_path / "vllm", monkeypatch)
    day = 86400
    c = {"base": up.commit("Initial", {"vllm/kv.py": KV_V1, "vllm/parser.py": PARSER_V1}, date=PIN_DATE)}
    git(up.path, "checkout", "-q", "-b", "releases/v1.0")
    up.commit("Bump version to 1.0.0", {"VERSION": "1.0.0\n"}, date=PIN_DATE + day)
    git(up.path, "tag", "v1.0.0")
    git(up.path, "checkout", "-q", "main")
    up.commit("[Misc] Docs (#201)", {"README": "docs\n"}, date=PIN_DATE + 2 * day)
    git(up.path, "checkout", "-q", "-b", "releases/v1.1")
    up.commit("Bump version to 1.1.0", {"VERSION": "1.1.0\n"}, date=PIN_DATE + 3 * day)
    git(up.path, "tag", "v1.1.0")
    git(up.path, "checkout", "-q", "main")
    c["kv"] = up.commit("[Core] Free blocks past null gaps (#202)", {"vllm/kv.py": KV_FIXED}, date=PIN_DATE + 10 * day)
    c["parser"] = up.commit("[Parser] Fix the parser (#203)", {"vllm/parser.py": PARSER_FIXED}, date=PIN_DATE + 11 * day)
    git(up.path, "checkout", "-q", "-b", "releases/v1.2")
    up.commit("Bump version to 1.2.0", {"VERSION": "1.2.0\n"}, date=PIN_DATE + 12 * day)
    git(up.path, "tag", "v1.2.0")
    git(up.path, "checkout", "-q", "releases/v1.1")
    late = clock == "true"
    c["pick"] = up.pick(c["kv"], date=PIN_DATE + (18 if late else 5) * day)
    up.commit("Bump version to 1.1.1", {"VERSION": "1.1.1\n"}, date=PIN_DATE + (19 if late else 6) * day)
    git(up.path, "tag", "v1.1.1")
    git(up.path, "checkout", "-q", "main")
    up.commit("[Misc] Keep main moving (#204)", {"README": "main\n"}, date=PIN_DATE + 20 * day)
    fixes = {"kv": ("vllm/kv.py", KV_FIXED, 202), "parser": ("vllm/parser.py", PARSER_FIXED, 203)}
    root = make_project(tmp_path / "project", up, "v1.0.0", fixes)

    pairs = [(ref, git(up.path, "rev-parse", ref).strip()) for ref in ("main", "v1.2.0", "v1.1.1", "v1.0.0", "v1.1.0")]
    assert [ref for ref, _ in lineage.ancestry_order(up.path, pairs, branch="main")] == [
        "v1.0.0", "v1.1.0", "v1.1.1", "v1.2.0", "main"]

    doc = status(root, "v1.2.0", "v1.1.1", "main")
    assert doc["targets"] == ["v1.0.0", "v1.1.1", "v1.2.0", "main"]
    kv = landing(doc, "kv")
    # first landed on v1.1.1 (the pick); the release branch's own commits are bisected
    assert (kv["ref"], kv["commit"], kv["release"]) == ("v1.1.1", c["pick"], "v1.1.1")
    assert doc["patches"][0]["results"]["v1.1.1"]["state"] == "landed"
    parser = landing(doc, "parser")
    assert (parser["ref"], parser["commit"], parser["release"]) == ("v1.2.0", c["parser"], "v1.2.0")

    # judged on main alone: #202 on main, whose first release is v1.1.1 through the pick
    kv = landing(status(root, "main"), "kv")
    assert (kv["commit"], kv["release"]) == (c["kv"], "v1.1.1")
    assert kv["release_proof"]["commit"] == c["pick"] and kv["release_proof"]["cherry_pick"]
