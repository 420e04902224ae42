"""`vpatch forward` on the shipped project and the real vLLM release history (issue 62's "done when").

0003 goes onto v0.34.0 as update carries it there (narrowed through upstream's rewrite to its parser_engine.py hunk),
with a pytest module made from its probe under tests/parser/ that fails on v0.34.0 and passes with the hunk, run by
upstream's pytest in the probe venv; upstream's parser tests show no regression; the mail form applies to a clean
v0.34.0 with `git am`. 0002, landed in v0.30.0, is refused with its evidence.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REAL_CACHE, git
from helpers.shipped import committed_copy, shipped_files
from typer.testing import CliRunner

from vpatch.commands.cli import app
from vpatch.upstream import history_path

pytestmark = [pytest.mark.releases, pytest.mark.probe_venv]

ENGINE = "vllm/parser/engine/parser_engine.py hunk 1 (@@ -865,7 +865,11 @@)"
QWEN3 = "vllm/parser/qwen3.py hunk 1 (@@ -168,6 +168,29 @@)"
TEST = "tests/parser/test_qwen3_tool_call_unclosed_function.py"


@pytest.fixture(autouse=True)
def real_cache(monkeypatch: pytest.MonkeyPatch, release_history: Path) -> None:
    monkeypatch.setenv("VPATCH_CACHE", str(REAL_CACHE))


def forward(root: Path, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["-C", str(root), "forward", *args])
    return result.exit_code, result.stdout, result.output


def test_forward_0003_onto_v0_34_0_with_a_test_that_fails_without_it_and_passes_with_it(tmp_path: Path) -> None:
    root = committed_copy(tmp_path / "project", shipped_files())
    before = {str(p.relative_to(root)): p.read_bytes() for p in (root / "patches").rglob("*") if p.is_file()}
    code, out, both = forward(root, "3", "--json")
    assert code == 0, both
    done = json.loads(out)
    assert (done["ref"], done["way"], done["kept_hunks"]) == ("v0.34.0", "narrow", [ENGINE])
    assert [h["name"] for h in done["dropped_hunks"]] == [QWEN3] and done["dropped_hunks"][0]["rewritten"]
    assert done["test"] == {"path": TEST, "generated": True,
                            "source": "probes/0003-qwen3-tool-call-unclosed-function.py",
                            "without_patch": "failed", "with_patch": "passed"}
    found = done["regressions"]
    assert found["complete"] and found["regressions"] == [] and found["passed"] > 100, found
    assert found["tests"] == ["tests/parser/engine/test_parser_engine.py"]
    assert done["lint"] == "not checked: ruff absent from the probe venv"  # the shipped lock holds no ruff

    tree = Path(done["worktree"])
    assert git(tree, "rev-parse", "--abbrev-ref", "HEAD").strip() == \
        "vpatch/forward/0003-qwen3-tool-call-unclosed-function"
    assert git(tree, "rev-parse", "HEAD^").strip() == done["commit"]
    assert sorted(git(tree, "show", "--name-only", "--format=", "HEAD").split()) == sorted(
        [TEST, "vllm/parser/engine/parser_engine.py"])
    written = (tree / TEST).read_text()
    assert "import vpatch" not in written and "from vpatch" not in written
    assert written.startswith("# SPDX-License-Identifier: Apache-2.0\n")
    message = git(tree, "log", "-1", "--format=%B")
    assert message.startswith("qwen3 parser: close a tool call whose <function= is left open\n\n")
    assert f"- {QWEN3}: upstream rewrote its lines" in message and "Origin: vendor" not in message
    assert f"Test: {TEST} fails on\nv0.34.0 without this change and passes with it" in message

    # the mail form applies to a clean v0.34.0 with `git am`
    clean = tmp_path / "clean"
    git(tmp_path, "clone", "-q", "--shared", "--no-checkout", str(history_path(REAL_CACHE)), str(clean))
    git(clean, "checkout", "-q", "--detach", "v0.34.0")
    git(clean, "am", "-q", done["format_patch"])
    assert git(clean, "rev-parse", "HEAD^{tree}") == git(tree, "rev-parse", "HEAD^{tree}")

    body = Path(done["pr_body"]).read_text()
    assert "## Purpose" in body and "streamed the whitespace before the next tag as part of" in body  # the bug
    assert f"pytest {TEST}" in body and "## Test Result" in body  # the reproduction and the test
    assert f"`{TEST}`: failed without this change, passed with it." in body
    # nothing in patches/ changed
    assert {str(p.relative_to(root)): p.read_bytes() for p in (root / "patches").rglob("*") if p.is_file()} == before


def test_forward_refuses_0002_which_landed_naming_its_evidence(tmp_path: Path) -> None:
    root = committed_copy(tmp_path / "project", shipped_files())
    code, _, both = forward(root, "2", "--onto", "v0.34.0")
    assert code == 1, both
    assert "not forwarding 0002-mamba-null-gap-free.patch: it is landed on v0.34.0, so update would drop it" in both
    assert "Applied-Upstream: v0.30.0" in both
    assert not (root / ".vpatch" / "forward" / "0002").exists()
