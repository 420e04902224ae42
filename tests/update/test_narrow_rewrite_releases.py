"""Narrowing through upstream's own rewrite, on the real vLLM release history (issue 43, item 2).

The shipped 0003 has two hunks: vllm/parser/qwen3.py (the transitions, which upstream rewrote itself in
v0.33.0, so the hunk no longer applies) and vllm/parser/engine/parser_engine.py (the streamed name's strip,
still needed). `update --to v0.33.0` carries 0003 as the parser_engine.py hunk alone, with proof: the probe
covers the qwen3.py hunk on the pin, fails on v0.33.0 unpatched and passes with the rest, upstream's tests show
no regression. A conflicting hunk whose behaviour upstream does not have, or one the probe does not cover, is
never narrowed away: the update stops for a person.

The two negative cases replace 0003's probe with a declarative file probe (kind: files) on the real sources:
it reads what the patched files say rather than running the parser, which makes "the behaviour is absent on
the target" exact (v0.33.0's qwen3.py has no such text) and the cases fast. The positive case runs the real
behavioural probe (the parser, in the probe venv) and upstream's own parser tests.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from conftest import REAL_CACHE, git
from helpers.shipped import committed_copy, shipped_files, vpatch

from vpatch.config.project import Config

pytestmark = [pytest.mark.releases, pytest.mark.probe_venv]

PATCH = "0003-qwen3-tool-call-unclosed-function.patch"
PROBE = "patches/probes/0003-qwen3-tool-call-unclosed-function.yaml"
QWEN3 = "vllm/parser/qwen3.py hunk 1 (@@ -168,6 +168,29 @@)"
ENGINE = "vllm/parser/engine/parser_engine.py hunk 1 (@@ -865,7 +865,11 @@)"
# what each hunk of 0003 adds, verbatim (a file probe checks for it)
STRIP = "name = slot.name.strip() or self._try_extract_name(idx)"
MALFORMED = "# Malformed: the model left <function=NAME without its"


def project(tmp_path: Path, probe: str | None = None) -> Path:
    files = shipped_files()
    if probe is not None:
        files[PROBE] = probe.encode()
    return committed_copy(tmp_path / "project", files)


def file_probe(*checks: tuple[str, str]) -> str:
    lines = ["# test stand-in for 0003's probe: the text each hunk adds", "kind: files", "files:"]
    for path, text in checks:
        lines += [f"  {path}:", f"    contains: [{text!r}]"]
    return "\n".join(lines) + "\n"


@pytest.fixture(autouse=True)
def real_cache(monkeypatch: pytest.MonkeyPatch, release_history: Path) -> None:
    monkeypatch.setenv("VPATCH_CACHE", str(REAL_CACHE))


def test_update_carries_0003_narrowed_to_its_parser_engine_hunk_with_proof(tmp_path: Path) -> None:
    root = project(tmp_path)
    started = time.monotonic()
    code, out = vpatch(root, "update", "--to", "v0.33.0")
    seconds = time.monotonic() - started
    assert code == 0, out
    assert Config.load(root).pin.ref == "v0.33.0"
    assert sorted(p.name for p in (root / "patches").glob("*.patch")) == [PATCH]
    text = (root / "patches" / PATCH).read_text()
    # the rest: the parser_engine.py hunk alone
    assert "diff --git a/vllm/parser/qwen3.py" not in text and STRIP in text
    assert len(re.findall(r"^@@ ", text, re.MULTILINE)) == 1
    # the header names the dropped hunk, the upstream change, and the proof
    head = text.split("\ndiff --git ")[0]
    assert f"- {QWEN3}\n  Rewritten-Upstream: since v0.29.0 by: " in head
    # the one commit of the release history that changed them, and the release it is
    assert '"vllm 0.33.0 (from PyPI sdist vllm-0.33.0.tar.gz)" (release v0.33.0)' in head
    assert "cite issue #58227" in head  # upstream's comments there cite the issue it fixed
    assert ("Proof: probes/0003-qwen3-tool-call-unclosed-function.yaml covers each dropped hunk on v0.29.0 (fails "
            "without it there), fails on v0.33.0 unpatched and passes with the rest") in head
    assert "upstream's own tests of the touched files show no regression" in head
    # the trailers stay the last paragraph
    assert head.rstrip().splitlines()[-1].startswith("Last-Update: ")
    retired = (root / "patches" / "RETIRED.md").read_text()
    section = retired.split("## 0003-qwen3-tool-call-unclosed-function (narrowed)\n")[1]
    assert f"- Dropped hunk: {QWEN3}\n  - Rewritten-Upstream: since v0.29.0 by: " in section
    assert f"- Kept hunk: {ENGINE}" in section
    message = git(root, "log", "-1", "--format=%B")
    assert message.startswith("Update upstream pin v0.29.0 -> v0.33.0: drop 0001, 0002, narrow 0003")
    assert f"  Dropped: {QWEN3}\n    Rewritten-Upstream: " in message
    # the narrowed patch is what the tree holds: it applies and its probe validates on the new pin
    code, out = vpatch(root, "probe", "check", "0003")
    assert code == 0 and "fails without the patch" in out, out
    print(f"update v0.29.0 -> v0.33.0 narrowing 0003 through upstream's rewrite: {seconds:.1f}s")


def test_a_covered_hunk_whose_behaviour_upstream_lacks_is_not_narrowed_away(tmp_path: Path) -> None:
    # the probe sees both hunks (it fails without either on v0.29.0), and v0.33.0 does not have what the
    # qwen3.py hunk adds: with the rest alone the probe fails there, so the update stops for a person
    root = project(tmp_path, file_probe(("vllm/parser/engine/parser_engine.py", STRIP),
                                        ("vllm/parser/qwen3.py", MALFORMED)))
    code, out = vpatch(root, "update", "--to", "v0.33.0")
    assert code == 5, out
    assert f"stopped at {PATCH}" in out, out
    assert "not narrowed through upstream's rewrite: its probe does not validate the rest on v0.33.0" in out, out
    assert vpatch(root, "update", "--abort")[0] == 0
    assert Config.load(root).pin.ref == "v0.29.0" and git(root, "status", "--porcelain") == ""


def test_a_hunk_the_probe_does_not_cover_is_not_narrowed_away(tmp_path: Path) -> None:
    # the probe sees the parser_engine.py hunk only: without the qwen3.py hunk it still passes on v0.29.0, so
    # nothing proves that upstream's rewrite does what that hunk did; the update stops for a person
    root = project(tmp_path, file_probe(("vllm/parser/engine/parser_engine.py", STRIP)))
    code, out = vpatch(root, "update", "--to", "v0.33.0")
    assert code == 5, out
    assert f"stopped at {PATCH}" in out, out
    assert f"its probe does not cover {QWEN3} on v0.29.0" in out, out
    assert vpatch(root, "update", "--abort")[0] == 0
    assert Config.load(root).pin.ref == "v0.29.0"


def test_status_checks_the_hunks_coverage_in_the_command_s_session(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The narrowing status shows for 0003 at v0.33.0 rests on the probe's coverage of each hunk on the pin: those
    runs are the command's (its session: its trees, its warm interpreter, --jobs; its progress), not a silent
    session of their own, as they were (~18 s with no line on a first run). The real coverage runs; the test
    records what it was handed."""
    from vpatch.base import silent
    from vpatch.update import disposition

    handed: list[tuple[object, object]] = []
    real = disposition.hunk_coverage

    def recorded(*args, **kwargs):  # type: ignore[no-untyped-def]
        handed.append((kwargs.get("session"), kwargs.get("report", silent)))
        return real(*args, **kwargs)

    monkeypatch.setattr(disposition, "hunk_coverage", recorded)
    root = project(tmp_path)
    code, out = vpatch(root, "status", "--against", "v0.33.0")
    assert code == 0, out
    assert "would narrow" in out, out
    assert handed, "no per-hunk coverage was asked for"
    assert all(session is not None and report is not silent for session, report in handed), handed
