"""Regression evidence in `vpatch update` and `vpatch status` on the real release history: main's 0003, with its
transition (TOOL_ARGS, TOOL_START), rebased by hand onto v0.33.0 breaks two of upstream's own tests there, and the
update refuses it naming them; the same patch pinned at v0.33.0 shows the regression in status."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REAL_CACHE, git, vpatch_json
from helpers.shipped import committed_copy, shipped_files, vpatch

from vpatch.config.project import Config

pytestmark = [pytest.mark.releases, pytest.mark.probe_venv]

UPSTREAM_TESTS = (
    "tests/parser/engine/test_qwen3.py::TestNonStreaming::test_tool_call_tag_is_ok_inside_parameter",
    "tests/parser/engine/test_qwen3.py::TestStreaming::test_streaming_tool_call_tag_is_ok_inside_parameter",
)
ANCHOR = ('            (ParserState.TOOL_ARGS, "FUNC_PREFIX"): Transition(\n'
          "                ParserState.TOOL_NAME,\n"
          "                (EventType.TOOL_CALL_END, EventType.TOOL_CALL_START),\n"
          "            ),\n")
FIFTH = ('            (ParserState.TOOL_ARGS, "TOOL_START"): Transition(\n'
         "                ParserState.TOOL_PREAMBLE,\n"
         "                (EventType.TOOL_CALL_END, EventType.TOOL_CALL_START),\n"
         "            ),\n")


@pytest.fixture
def shipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release_history: Path) -> Path:
    monkeypatch.setenv("VPATCH_CACHE", str(REAL_CACHE))
    return committed_copy(tmp_path / "project", shipped_files())


def resolve_as_main_s_0003(tree: Path, release_history: Path) -> None:
    """The resolution a person made moving main's 0003 to v0.33.0: upstream's four transitions kept, the fifth
    added (it was in the patch, and the probe of that day passed)."""
    upstream = git(release_history, "show", "v0.33.0:vllm/parser/qwen3.py")
    assert upstream.count(ANCHOR) == 1
    (tree / "vllm/parser/qwen3.py").write_text(upstream.replace(ANCHOR, ANCHOR + FIFTH))
    git(tree, "add", "vllm/parser/qwen3.py")


def test_update_continue_refuses_main_s_0003_rebased_by_hand_naming_the_upstream_tests(
        shipped: Path, release_history: Path) -> None:
    # --no-narrow: the update would otherwise narrow 0003 through upstream's rewrite (no person needed); the
    # person here resolves the conflict by hand, as a person did before narrowing
    code, out = vpatch(shipped, "update", "--to", "v0.33.0", "--no-narrow")
    assert code == 5 and "stopped at 0003-qwen3-tool-call-unclosed-function.patch" in out, out
    tree = shipped / ".git" / "vpatch-update" / "tree"
    resolve_as_main_s_0003(tree, release_history)
    code, out = vpatch(shipped, "update", "--continue")
    assert code == 1, out
    assert "0003-qwen3-tool-call-unclosed-function.patch breaks upstream's own tests on v0.33.0: " in out, out
    for test in UPSTREAM_TESTS:
        assert test in out, out
    # nothing moved: the pin, the series
    assert Config.load(shipped).pin.ref == "v0.29.0"
    assert vpatch(shipped, "update", "--abort")[0] == 0


def test_status_on_a_pin_where_the_patch_breaks_upstream_tests_shows_the_regression(
        shipped: Path, release_history: Path, tmp_path: Path) -> None:
    # The project as it would stand had the update taken the hand-resolved patch: pin v0.33.0, only 0003, rebased.
    work = tmp_path / "work"
    git(tmp_path, "clone", "-q", "--no-checkout", str(release_history), str(work))
    git(work, "checkout", "-q", "--detach", "v0.33.0")
    resolve_as_main_s_0003(work, release_history)
    engine = work / "vllm/parser/engine/parser_engine.py"
    engine.write_text(engine.read_text().replace('            name = slot.name or self._try_extract_name(idx) or ""\n',
                                                 '            name = slot.name.strip() or self._try_extract_name(idx)'
                                                 ' or ""\n'))
    old = (shipped / "patches" / "0003-qwen3-tool-call-unclosed-function.patch").read_text()
    git(work, "commit", "-q", "-a", "-m", old.split("\nSubject: ", 1)[1].split("\ndiff --git", 1)[0].strip())
    for name in ("0001-qsa-fp8-kv.patch", "0002-mamba-null-gap-free.patch"):
        (shipped / "patches" / name).unlink()
    (shipped / "patches" / "0003-qwen3-tool-call-unclosed-function.patch").write_text(
        git(work, "format-patch", "-1", "--stdout", "--full-index"))
    commit = git(release_history, "rev-parse", "v0.33.0^{commit}").strip()
    config = (shipped / "vpatch.yaml").read_text().replace("ref: v0.29.0", "ref: v0.33.0")
    (shipped / "vpatch.yaml").write_text(config.replace(Config.load(shipped).pin.commit or "", commit))
    code, report = vpatch_json(shipped, "status", "--against", "v0.33.0", "--json", "--exit-code")
    assert code == 4, report
    result = next(p for p in report["patches"] if p["number"] == 3)["results"]["v0.33.0"]
    assert tuple(result["upstream_tests"]["regressions"]) == UPSTREAM_TESTS, result
    assert result["regression"].startswith("breaks upstream's own tests on the pin v0.33.0: ")
