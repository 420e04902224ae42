"""Carrying 0003 by hand to v0.33.0 on the real vLLM release history: the update stops at its qwen3.py conflict;
every command says so; the resolution made in the update tree survives --abort and is replayed by the restart;
a hand edit of patches/0003 committed during the stop is taken in; the commit says the patch was rewritten by
hand, with the probe that passed. tests/update/test_stopped_update.py covers each rule on toy upstreams."""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path

import pytest
from conftest import REAL_CACHE, git
from helpers.shipped import committed_copy, shipped_files, vpatch

from vpatch.config.project import Config

pytestmark = pytest.mark.releases

P0003 = "0003-qwen3-tool-call-unclosed-function.patch"
MARKS = ("<<<<<<< ", "=======", ">>>>>>> ")


@pytest.fixture
def shipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release_history: Path) -> Path:
    monkeypatch.setenv("VPATCH_CACHE", str(REAL_CACHE))
    return committed_copy(tmp_path / "project", shipped_files())


def union(path: Path) -> None:
    """Resolve each conflict by keeping both sides (upstream's reworded comments and the patch's transitions):
    what a person might do first, by hand."""
    lines = path.read_text().split("\n")
    path.write_text("\n".join(line for line in lines if not line.startswith(MARKS) and line != "======="))


def test_carry_0003_by_hand_to_v0_33_0(shipped: Path) -> None:
    # --no-narrow: without it the update carries 0003 narrowed through upstream's rewrite, no person needed
    # (test_narrow_rewrite_releases.py); here a person carries it by hand
    started = time.monotonic()
    tree = shipped / ".git" / "vpatch-update" / "tree"
    code, out = vpatch(shipped, "update", "--to", "v0.33.0", "--no-narrow")
    assert code == 5, out
    assert f"stopped at {P0003}" in out
    # upstream's side of the conflict: the one upstream commit (the v0.33.0 import) that changed those lines
    assert "upstream changed these lines between v0.29.0 and v0.33.0: 9bb7b9213904 vllm 0.33.0" in out, out
    qwen3 = tree / "vllm/parser/qwen3.py"
    text = qwen3.read_text()
    assert "<<<<<<< v0.33.0 (upstream, with the patches before it)\n" in text and f">>>>>>> {P0003}\n" in text

    # every command knows the stop, in words and in --json
    line = (f"update to v0.33.0 stopped at {P0003} (conflict in vllm/parser/qwen3.py): resolve in {tree}, then "
            "`vpatch update --continue` (or `--abort`)")
    assert vpatch(shipped, "update") == (5, line + "\n")
    code, out = vpatch(shipped, "status", "--no-probes")
    assert line in out
    assert json.loads(vpatch(shipped, "status", "--no-probes", "--json")[1])["stopped_update"]["line"] == line
    assert f"note: {line}" in vpatch(shipped, "apply")[1]
    # impossible flags are refused, and refusing them changes nothing
    for args in (["--abort", "--dry-run"], ["--continue", "--no-commit"], ["--abort", "--to", "v0.33.0"]):
        assert vpatch(shipped, "update", *args)[0] == 2, args
    assert qwen3.read_text() == text

    # resolve in the update tree, then abort: the resolution is kept, the project is as it was
    union(qwen3)
    git(tree, "add", "-A")
    resolved = qwen3.read_text()
    head = git(shipped, "rev-parse", "HEAD")
    code, out = vpatch(shipped, "update", "--abort")
    assert code == 0, out
    kept = shipped / ".git" / "vpatch-resolutions" / P0003.removesuffix(".patch")
    assert f"your resolution of {P0003} (vllm/parser/engine/parser_engine.py, vllm/parser/qwen3.py) is kept in {kept}" in out
    assert (kept / "files/vllm/parser/qwen3.py").read_text() == resolved
    assert git(shipped, "rev-parse", "HEAD") == head and git(shipped, "status", "--porcelain", "patches", "vpatch.yaml") == ""
    assert vpatch(shipped, "update")[0] == 0  # no update in progress

    # the restart replays it (the update still stops: a person checks it)
    code, out = vpatch(shipped, "update", "--to", "v0.33.0", "--no-narrow")
    assert code == 5, out
    assert f"replayed your resolution of {P0003}" in out and "as git rerere" in out
    assert qwen3.read_text() == resolved
    assert git(tree, "diff", "--name-only", "--diff-filter=U") == ""

    # the person writes the patch for v0.33.0 in patches/ instead, with a word in its message, and commits it
    patch = shipped / "patches" / P0003
    original = patch.read_text()
    header = original[:original.index("\ndiff --git ") + 1]
    header = header.replace("\nOrigin:", "\nRewritten on v0.33.0: upstream reworded the comments around it.\n\nOrigin:", 1)
    patch.write_text(header + git(tree, "diff", "--cached", "HEAD"))
    code, out = vpatch(shipped, "update", "--continue")
    assert code == 1 and "uncommitted changes in the series" in out  # refused, nothing touched
    assert qwen3.read_text() == resolved
    git(shipped, "commit", "-q", "-am", "0003 for v0.33.0, by hand")
    mine = git(shipped, "rev-parse", "HEAD").strip()
    code, out = vpatch(shipped, "update", "--continue")
    assert code == 0, out
    assert "took in 1 commit(s) made during the stop" in out
    assert f"took in patches/{P0003} as edited by hand: it applies on v0.33.0" in out
    assert f"refresh        {P0003}" in out  # not "stop at": it went in

    # the result: on top of the person's commit, the patch recorded as rewritten by hand, nothing lost
    assert git(shipped, "rev-parse", "HEAD~1").strip() == mine
    assert Config.load(shipped).pin.ref == "v0.33.0"
    text = patch.read_text()
    assert "Rewritten on v0.33.0: upstream reworded the comments around it." in text
    assert "Rewritten: by hand for v0.33.0 (conflict in vllm/parser/qwen3.py)\n" in text
    assert f"Last-Update: {datetime.date.today().isoformat()}" in text
    message = git(shipped, "log", "-1", "--format=%B")
    assert f"- {P0003}: Rewritten: by hand for v0.33.0" in message
    assert ("Evidence: probe probes/0003-qwen3-tool-call-unclosed-function.yaml re-validated on v0.33.0: fails "
            "without it, passes with it") in message
    # 0001 and 0002 left with their probe files; one release each in Applied-Upstream
    assert sorted(p.name for p in (shipped / "patches" / "probes").iterdir()) == [
        "0003-qwen3-tool-call-unclosed-function.py", "0003-qwen3-tool-call-unclosed-function.yaml",
        "requirements.lock"]
    assert "Applied-Upstream: v0.31.0 (first commit b69e877f934a)\n" in message
    assert "Applied-Upstream: v0.30.0 (first commit a604bdde9b0c)\n" in message
    # the tree's resolution that the hand edit replaced stays set aside
    assert (kept / "files/vllm/parser/qwen3.py").read_text() == resolved
    print(f"carried 0003 by hand to v0.33.0 (stop, abort, replay, hand edit, commit): {time.monotonic() - started:.1f}s")
