"""One disposition, three readers (issue 60): on the real vLLM release history, what `vpatch status` says an update
to a target does with each patch, what `update --dry-run` prints, and what the real update does in a scratch copy
of the project are the same, for the shipped series on every release after its pin and for constructed cases on
real vLLM code: a drop, a narrowing through upstream's rewrite, a stop on a needed conflict, a hunk whose code moved
to another file, an invalid probe. A failure names the patch, the target and the three answers.

Each real update runs once per (project, target) in a clone of the project; the probe results are the machine's
cache (REAL_CACHE), so the three readers share every probe run and the test measures the updates themselves.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from conftest import REAL_CACHE, git, vpatch_json, vpatch_streams
from helpers.releasepatch import commit_project, diff_on, mail
from helpers.shipped import committed_copy, shipped_files, vpatch

pytestmark = [pytest.mark.releases, pytest.mark.probe_venv]

RELEASES = ["v0.30.0", "v0.31.0", "v0.32.0", "v0.33.0", "v0.34.0"]
# the dry run's words for each action (report/disposition.py, the same as status's cell)
WORDS = {"would drop": "drop", "would re-apply": "carry", "would narrow": "narrow", "would stop at": "stop",
         "would refuse": "refuse"}
PLANNED = re.compile(r"^  (would (?:drop|re-apply|narrow|stop at|refuse))\s+(\S+\.patch)  \[", re.MULTILINE)
REFUSED = re.compile(r"^error: not moving the pin to \S+: (\S+\.patch)[: ]", re.MULTILINE)


@pytest.fixture(autouse=True)
def real_cache(monkeypatch: pytest.MonkeyPatch, release_history: Path) -> None:
    monkeypatch.setenv("VPATCH_CACHE", str(REAL_CACHE))


def said_by_status(root: Path, targets: list[str]) -> dict[tuple[str, str], str]:
    """(file, target) -> the action `status --json` gives (one status for every target)."""
    code, doc = vpatch_json(root, "status", "--json", *(a for t in targets for a in ("--against", t)))
    assert code == 0, doc
    return {(p["file"], t): str(p["results"][t]["action"]) for p in doc["patches"] for t in targets}


def said_by_dry_run(root: Path, target: str) -> dict[str, str]:
    """file -> the action `update --dry-run` prints (its words), also when it refuses the move."""
    code, out = vpatch(root, "update", "--to", target, "--dry-run")
    assert code in (0, 1, 5), out
    return {file: WORDS[verb] for verb, file in PLANNED.findall(out)}


def done_by_update(root: Path, tmp_path: Path, target: str) -> dict[str, str]:
    """file -> what the real update to `target` does, in a clone of the project: read from the project it leaves
    (a patch file gone: drop; narrowed in RETIRED.md: narrow; still there: carry), the patch it stops at (stop), or
    the patches its refusal names (refuse; the others were not reached); stopped, what it holds for the others."""
    scratch = tmp_path / f"real-{root.name}-{target}"
    git(tmp_path, "clone", "-q", str(root), str(scratch))
    before = sorted(p.name for p in (scratch / "patches").glob("*.patch"))
    code, out, err = vpatch_streams(scratch, "update", "--to", target, "--json")
    if code == 1:
        named = REFUSED.findall(err)
        assert named, err
        return dict.fromkeys(named, "refuse")
    if code == 5:
        # stopped: the patch it stops at, and what the stopped update holds to carry out for the others
        stopped = json.loads(out)
        held = {p["file"]: p["action"] for p in stopped["patches"]}
        return {**held, stopped["stop"]["file"]: "stop"}
    assert code == 0, out + err
    left = {p.name for p in (scratch / "patches").glob("*.patch")}
    retired = (scratch / "patches" / "RETIRED.md").read_text() if (scratch / "patches" / "RETIRED.md").is_file() else ""
    return {f: "drop" if f not in left else "narrow" if f"## {f.removesuffix('.patch')} (narrowed)" in retired
            else "carry" for f in before}


def three_answers(root: Path, tmp_path: Path, targets: list[str]) -> list[str]:
    """The (patch, target) pairs where status, the dry run and the real update disagree, each with the three."""
    status = said_by_status(root, targets)
    wrong = []
    for target in targets:
        started = time.monotonic()
        dry, real = said_by_dry_run(root, target), done_by_update(root, tmp_path, target)
        print(f"{root.name} -> {target}: dry run and real update in {time.monotonic() - started:.1f}s")
        for file in sorted({f for f, t in status if t == target}):
            answers = (status[(file, target)], dry.get(file, "(not printed)"), real.get(file, "(not reached)"))
            if file not in real and "refuse" in real.values():
                answers = (*answers[:2], answers[0])  # a refused move reaches no other patch: nothing to compare
            if len(set(answers)) != 1:
                wrong.append(f"{file} on {target}: status says {answers[0]}, the dry run {answers[1]}, "
                             f"the update does {answers[2]}")
    return wrong


def test_the_shipped_series_on_every_release_after_its_pin(tmp_path: Path) -> None:
    # drop (0001 from v0.31.0, 0002 from v0.30.0), carry (0003 to v0.32.0), narrow through upstream's rewrite (0003
    # on v0.33.0 and v0.34.0)
    root = committed_copy(tmp_path / "shipped", shipped_files())
    wrong = three_answers(root, tmp_path, RELEASES)
    assert not wrong, "status, update --dry-run and update disagree:\n" + "\n".join(wrong)
    # status names what the narrowing rests on: the qwen3.py hunk, upstream's change of it, the probe's proof
    code, doc = vpatch_json(root, "status", "--json", "--exit-code", "--against", "v0.33.0", "--against", "v0.34.0")
    assert code == 3, doc  # drops and a narrowing: nothing for a person
    (narrowed,) = [p for p in doc["patches"] if p["number"] == 3]
    for target in ("v0.33.0", "v0.34.0"):
        made = narrowed["results"][target]["disposition"]
        (hunk,) = made["dropped_hunks"]
        assert hunk["hunk"].startswith("vllm/parser/qwen3.py hunk 1") and hunk["rewritten"], made
        assert "(release v0.33.0)" in hunk["upstream"] and "cite issue #58227" in hunk["upstream"], made
        assert made["proof"].startswith("probes/0003-qwen3-tool-call-unclosed-function.yaml covers each dropped hunk "
                                        "on v0.29.0 (fails without it there)"), made


PROBE = "patches/probes/0003-qwen3-tool-call-unclosed-function.yaml"
STRIP = "name = slot.name.strip() or self._try_extract_name(idx)"
MALFORMED = "# Malformed: the model left <function=NAME without its"


def files_probe(*checks: tuple[str, str, str]) -> bytes:
    """A `files` probe standing in for 0003's: (path, contains or not_contains, text) each."""
    lines = ["kind: files", "files:"]
    for path, key, text in checks:
        lines += [f"  {path}:", f"    {key}: [{text!r}]"]
    return ("\n".join(lines) + "\n").encode()


CONSTRUCTED = {
    # both hunks covered and v0.33.0 lacks what the qwen3.py hunk adds: the rest fails its probe there, a stop
    "needed-conflict": files_probe(("vllm/parser/engine/parser_engine.py", "contains", STRIP),
                                   ("vllm/parser/qwen3.py", "contains", MALFORMED)),
    # a probe that passes on the pin without the patch tells nothing: INVALID, the move is refused
    "invalid-probe": files_probe(("vllm/parser/engine/parser_engine.py", "not_contains", "NO SUCH LINE")),
}


@pytest.mark.parametrize("case", list(CONSTRUCTED))
def test_constructed_cases_on_the_shipped_series(tmp_path: Path, case: str) -> None:
    root = committed_copy(tmp_path / case, {**shipped_files(), PROBE: CONSTRUCTED[case]})
    wrong = three_answers(root, tmp_path, ["v0.33.0"])
    assert not wrong, "status, update --dry-run and update disagree:\n" + "\n".join(wrong)


KV = "vllm/v1/core/kv_cache_utils.py"
KV_CHANGE = ("left, right = 1, original_max_model_len", "left, right = 1, max(original_max_model_len, 1)")


def test_a_hunk_whose_code_moved_to_another_file(tmp_path: Path, release_history: Path) -> None:
    # v0.33.0 moved estimate_max_model_len out of kv_cache_utils.py (which stays) into kv_cache_planning.py: the
    # change follows its code, and the relocation's proof is what carries it (status and the dry run run it too)
    root = tmp_path / "moved"
    (root / "patches").mkdir(parents=True)
    (root / "patches" / "0001-max-model-len.patch").write_bytes(mail(
        "Never search below length 1", diff_on(release_history, tmp_path, "v0.32.0", KV, KV_CHANGE)))
    commit_project(root)
    wrong = three_answers(root, tmp_path, ["v0.33.0"])
    assert not wrong, "status, update --dry-run and update disagree:\n" + "\n".join(wrong)
