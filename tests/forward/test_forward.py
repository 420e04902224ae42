"""`vpatch forward` on a toy git upstream: a needed patch sent with its own test, recorded, then merged upstream as a
squash commit "(#N)" reworded with the test: status goes from forwarded to landed, the update drops it, RETIRED.md
names the PR. The test runs with upstream's pytest in the probe venv (the real one, from the user's cache)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import KV_FIXED, KV_V1, REAL_CACHE, Project, git
from conftest import vpatch_cli as run
from helpers.project import commit_all
from typer.testing import CliRunner

from vpatch.base.paths import cache_dir
from vpatch.commands.cli import app
from vpatch.series import Patch, pull_number, with_forwarded

PR = 4321
URL = f"https://github.com/vllm-project/vllm/pull/{PR}"
TEST_PATH = "tests/test_kv_skip_null.py"
# upstream's style of test for the kv fix: freeing [1, None, 2] must release 2 and then 1 (v1.0 stops at None)
TEST = """import vllm.kv as kv


def test_free_skips_null_blocks() -> None:
    freed: list[int] = []
    kv.release = freed.append
    kv.free([1, None, 2])
    assert freed == [2, 1]
"""
PROBE = f"""kind: files
files:
  vllm/kv.py:
    contains: ["continue"]
upstream_test: {TEST_PATH}
"""


@pytest.fixture
def sent(project: Project) -> Project:
    """0001 (the kv fix, needed) with a file probe naming its upstream test; the probe venv's lock; upstream's main
    one commit past the pin. The probe venv comes from the user's cache (it is 1.3 GB)."""
    (cache_dir() / "probe-venvs").symlink_to(REAL_CACHE / "probe-venvs", target_is_directory=True)
    probes = project.patches / "probes"
    probes.mkdir()
    lock = Path(__file__).resolve().parents[2] / "patches" / "probes" / "requirements.lock"
    (probes / "requirements.lock").write_bytes(lock.read_bytes())
    (probes / "0001-kv-skip-null.yaml").write_text(PROBE)
    (probes / "test_kv_skip_null.py").write_text(TEST)
    project.make_patch(1, "kv-skip-null", {"vllm/kv.py": KV_FIXED}, "kv: skip null blocks when freeing",
                       trailers="Origin: vendor\nForwarded: no\nProbe: probes/0001-kv-skip-null.yaml\n"
                                "Last-Update: 2026-09-01")
    commit_all(project)
    project.upstream.commit({"README": "toy vllm, main\n"}, "docs: readme (#4000)")
    assert run(project, "fetch")[0] == 0
    return project


def forward_json(project: Project, *args: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    result = CliRunner().invoke(app, ["--project", str(project.root), "forward", *args, "--json"])
    return result.exit_code, json.loads(result.stdout) if result.exit_code in (0, 5) else {"output": result.output}


@pytest.mark.probe_venv
def test_forward_then_record_then_upstream_merges_it_as_its_pr(sent: Project) -> None:
    before = {p.name: p.read_bytes() for p in sent.patches.rglob("*") if p.is_file()}
    code, done = forward_json(sent, "1")
    assert code == 0, done
    main = git(sent.upstream.path, "rev-parse", "main").strip()
    assert (done["ref"], done["commit"], done["way"]) == ("main", main, "carry")
    assert done["test"] == {"path": TEST_PATH, "generated": False, "source": "probes/test_kv_skip_null.py",
                            "without_patch": "failed", "with_patch": "passed"}
    tree = Path(done["worktree"])
    assert git(tree, "rev-parse", "--abbrev-ref", "HEAD").strip() == "vpatch/forward/0001-kv-skip-null"
    assert git(tree, "show", "--name-only", "--format=%s", "HEAD").split() == [
        "kv:", "skip", "null", "blocks", "when", "freeing", TEST_PATH, "vllm/kv.py"]
    assert git(tree, "rev-parse", "HEAD^").strip() == main
    # the mail form applies to a clean clone of upstream's main with `git am`
    clean = sent.root.parent / "clean"
    git(sent.root.parent, "clone", "-q", str(sent.upstream.path), str(clean))
    git(clean, "am", "-q", done["format_patch"])
    assert (clean / "vllm/kv.py").read_text() == KV_FIXED and (clean / TEST_PATH).read_text() == TEST
    body = Path(done["pr_body"]).read_text()
    assert "## Purpose" in body and "kv: skip null blocks when freeing" in body and f"pytest {TEST_PATH}" in body
    assert f"`{TEST_PATH}`: failed without this change, passed with it" in body
    # nothing in patches/ changed
    assert {p.name: p.read_bytes() for p in sent.patches.rglob("*") if p.is_file()} == before

    # --record: Forwarded and Upstream-PR in the header, every other byte as it was
    code, out = run(sent, "forward", "1", "--record", URL)
    assert code == 0, out
    path = sent.patches / "0001-kv-skip-null.patch"
    old, new = before[path.name].decode(), path.read_text()
    assert new == old.replace("Forwarded: no\n", f"Forwarded: {URL}\nUpstream-PR: {PR}\n")
    assert run(sent, "forward", "1", "--record", URL)[1].rstrip().endswith("(already so)")
    commit_all(sent, "record the PR")
    result = CliRunner().invoke(app, ["--project", str(sent.root), "status", "--no-probes", "--json"])
    entry = json.loads(result.stdout)["patches"][0]
    assert entry["forwarded"] == {"url": URL, "pr": PR}
    assert {r["state"] for r in entry["results"].values()} == {"needed"}
    code, table = run(sent, "status", "--no-probes")
    assert table.count(f"forwarded (PR #{PR})") == 2, table  # needed on the pin and on main

    # upstream squash-merges it reworded, with the test: "(#N)" in the subject
    sent.upstream.commit({"vllm/kv.py": KV_FIXED, TEST_PATH: TEST},
                         f"[Bugfix] Free every block of a range, not just up to a null one (#{PR})")
    assert run(sent, "fetch")[0] == 0
    result = CliRunner().invoke(app, ["--project", str(sent.root), "status", "--no-probes", "--json"])
    entry = json.loads(result.stdout)["patches"][0]
    at_main = entry["results"]["main"]
    assert at_main["state"] == "landed", at_main
    assert any(f"#{PR}" in e["detail"] for e in at_main["evidence"]), at_main["evidence"]
    code, table = run(sent, "status", "--no-probes")
    assert table.count(f"forwarded (PR #{PR})") == 1, table  # the pin's cell; main's says landed
    code, out = run(sent, "update", "--to", "main")
    assert code == 0, out
    assert not path.exists()
    retired = (sent.patches / "RETIRED.md").read_text()
    assert "0001-kv-skip-null" in retired and f"Upstream-PR: {PR}" in retired


@pytest.mark.probe_venv
def test_a_landed_patch_is_refused_with_its_evidence(sent: Project) -> None:
    sent.upstream.commit({"vllm/kv.py": KV_FIXED}, "kv: skip null blocks (#555)")
    assert run(sent, "fetch")[0] == 0
    code, out = run(sent, "forward", "1")
    assert code == 1, out
    assert "not forwarding 0001-kv-skip-null.patch: it is landed on main, so update would drop it" in out
    assert not (sent.root / ".vpatch" / "forward" / "0001" / "tree").exists()


@pytest.mark.probe_venv
def test_a_conflicting_patch_stops_for_a_person_and_continue_takes_the_resolution(sent: Project) -> None:
    # upstream rewrote the line the patch changes: the patch does not apply on main, not even 3-way
    sent.upstream.commit({"vllm/kv.py": KV_V1.replace("break", "return")}, "kv: return at a null block")
    assert run(sent, "fetch")[0] == 0
    code, stopped = forward_json(sent, "1")
    assert code == 5, stopped
    assert stopped["outcome"] == "stopped" and stopped["conflicts"] == ["vllm/kv.py"]
    tree = Path(stopped["worktree"])
    assert "<<<<<<<" in (tree / "vllm/kv.py").read_text()
    # not resolved yet: refused, nothing taken in
    code, out = run(sent, "forward", "1", "--continue")
    assert code == 1 and f"unresolved paths in {tree}: vllm/kv.py" in out, out
    # the person resolves it in the work tree
    (tree / "vllm/kv.py").write_text(KV_FIXED)
    git(tree, "add", "vllm/kv.py")
    code, done = forward_json(sent, "1", "--continue")
    assert code == 0, done
    assert done["test"]["without_patch"] == "failed" and done["test"]["with_patch"] == "passed"
    main = git(sent.upstream.path, "rev-parse", "main").strip()
    assert git(tree, "rev-parse", "HEAD^").strip() == main
    assert git(tree, "show", "HEAD:vllm/kv.py") == KV_FIXED
    assert not (sent.root / ".vpatch" / "forward" / "0001" / "forward.json").exists()


def test_record_is_byte_stable_and_names_the_pull_request() -> None:
    raw = (b"From 0 Mon Sep 17 00:00:00 2001\nSubject: x\n\nWhy.\n\nOrigin: vendor\nForwarded: no\n"
           b"Last-Update: 2026-09-01\n\ndiff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n")
    out = with_forwarded(raw, URL, pull_number(URL), where="0001-x.patch")
    assert out == raw.replace(b"Forwarded: no\n", f"Forwarded: {URL}\nUpstream-PR: {PR}\n".encode())
    again = with_forwarded(out, "https://example.org/list/msg/1", None, where="0001-x.patch")
    assert again == out.replace(URL.encode(), b"https://example.org/list/msg/1")
    assert pull_number("https://github.com/vllm-project/vllm/issues/5") is None
    patch = Patch.parse(out, number=1, slug="x", path=Path("0001-x.patch"))
    assert patch.forwarded is not None and (patch.forwarded.url, patch.forwarded.pr) == (URL, PR)
    assert Patch.parse(raw, number=1, slug="x", path=Path("0001-x.patch")).forwarded is None



def test_bad_inputs_say_what_is_wrong(project: Project) -> None:
    project.make_patch(1, "kv-skip-null", {"vllm/kv.py": KV_FIXED}, "kv: skip null blocks when freeing")
    commit_all(project)
    code, out = run(project, "forward", "1", "--record", "not a url")
    assert code == 1 and "--record 'not a url' is not a URL" in out
    code, out = run(project, "forward", "1", "--record", URL, "--onto", "v1.0")
    assert code == 2 and "--record takes neither --onto nor --continue" in out
    code, out = run(project, "forward", "1", "--continue")
    assert code == 1 and "no stopped forward of 0001-kv-skip-null.patch to continue" in out
    code, out = run(project, "forward", "7")
    assert code == 1 and "no patch '7'" in out
    code, out = run(project, "forward", "1", "--onto", "v9.9")
    assert code == 1 and "v9.9" in out
    # a patch without a probe has nothing to make its upstream test from
    code, out = run(project, "forward", "1", "--onto", "v1.0")
    assert code == 1 and "has no probe to make its upstream test from" in out, out


@pytest.mark.parametrize(("value", "says"), [
    ("src/test_kv.py", "upstream_test: 'src/test_kv.py' is not a test file path in upstream's tests/"),
    ("tests/test_missing.py", "upstream_test: tests/test_missing.py: no file test_missing.py beside the probe"),
])
def test_a_wrong_upstream_test_is_named(project: Project, value: str, says: str) -> None:
    probes = project.patches / "probes"
    probes.mkdir()
    (probes / "0001-kv.yaml").write_text(f"kind: files\nfiles:\n  vllm/kv.py:\n    contains: [continue]\n"
                                         f"upstream_test: {value}\n")
    project.make_patch(1, "kv", {"vllm/kv.py": KV_FIXED}, "kv: skip null blocks",
                       trailers="Origin: vendor\nProbe: probes/0001-kv.yaml\nLast-Update: 2026-09-01")
    commit_all(project)
    code, out = run(project, "forward", "1", "--onto", "v1.0")
    assert code == 1 and says in out, out
