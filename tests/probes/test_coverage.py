"""Per-hunk coverage (probes/coverage.py) and what `vpatch probe check` says of it and of upstream's own tests:
toy projects in real git repositories; the shipped 0003 on the real release history."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import PARSER_V1, REAL_CACHE, Project, write_config
from conftest import vpatch_cli as run
from helpers.calcupstream import CALC, TESTS

from vpatch import git
from vpatch.base.paths import cache_dir
from vpatch.probes import ProbeOutcome, hunk_coverage
from vpatch.probes.coverage import hunks, without
from vpatch.series.files import Series
from vpatch.upstream import mirror

SHIPPED = Path(__file__).resolve().parents[2] / "patches"
TWO_HUNKS = PARSER_V1.replace("line 5\n", "line 5 fixed\n").replace("line 30\n", "line 30 tidied\n")


def two_hunk_patch(project: Project, probe: str) -> None:
    (project.patches / "probes").mkdir(exist_ok=True)
    (project.patches / "probes" / "0001-parser-two.yaml").write_text(probe)
    project.make_patch(1, "parser-two", {"vllm/parser.py": TWO_HUNKS}, "parser: two changes",
                       trailers="Origin: vendor\nProbe: probes/0001-parser-two.yaml\nLast-Update: 2026-09-01")


def test_a_hunk_the_probe_passes_without_is_named_not_covered(project: Project) -> None:
    two_hunk_patch(project, "kind: files\nfiles:\n  vllm/parser.py:\n    contains: ['line 5 fixed']\n")
    series = Series.load(project.patches)
    (patch,) = series.patches
    assert hunks(patch) == ["vllm/parser.py hunk 1 (@@ -2,7 +2,7 @@)", "vllm/parser.py hunk 2 (@@ -27,7 +27,7 @@)"]
    assert b"line 30 tidied" not in without(patch, hunks(patch)[1]) and b"line 5 fixed" in without(patch, hunks(patch)[1])
    repo = mirror.fetch(cache_dir(), project.upstream.url)
    base = git.resolve_commit(repo, "v1.0")
    found = hunk_coverage(repo, list(series.patches), patch, base=base, ref="v1.0")
    assert [h.covered for h in found.hunks] == [True, False]
    assert found.uncovered == ("vllm/parser.py hunk 2 (@@ -27,7 +27,7 @@)",)
    assert found.hunks[1].outcome is ProbeOutcome.PASS
    assert "NOT covered (the probe passes without it): vllm/parser.py hunk 2" in found.says()

    # through the command: the probe validates, and the line says which hunk it does not see
    code, out = run(project, "probe", "check", "1")
    assert code == 0, out
    assert "coverage: probe 0001-parser-two.yaml covers 1 of 2 hunks; NOT covered" in out
    assert "    NOT covered vllm/parser.py hunk 2 (@@ -27,7 +27,7 @@): passes without it: all 1 file checks hold" in out
    assert "regressions: upstream tests: none found for the files it touches" in out


def test_a_probe_that_checks_both_hunks_covers_both(project: Project) -> None:
    two_hunk_patch(project, "kind: files\nfiles:\n  vllm/parser.py:\n    contains: ['line 5 fixed', 'line 30 tidied']\n")
    code, out = run(project, "probe", "check", "1", "--no-upstream-tests")
    assert code == 0, out
    assert "coverage: probe 0001-parser-two.yaml covers 2 of 2 hunks" in out and "NOT covered" not in out
    assert "regressions:" not in out


@pytest.mark.probe_venv
def test_probe_check_fails_on_a_patch_that_breaks_an_upstream_test(project: Project) -> None:
    # v1.1 brings vllm/calc.py and its tests (the root conftest, as vLLM's, cannot load here)
    project.upstream.commit({"vllm/__init__.py": "", "vllm/calc.py": CALC, "tests/__init__.py": "",
                             "tests/conftest.py": "raise RuntimeError('needs an accelerator')\n",
                             "tests/calc/__init__.py": "", "tests/calc/test_calc.py": TESTS}, "v1.1", tag="v1.1")
    write_config(project.root, project.upstream.url, "v1.1")
    mirror.fetch(cache_dir(), project.upstream.url)
    # the probe venv (CPU torch and the rest, 1.2 GB) as built in the user's cache, not once more in the test's
    (cache_dir() / "probe-venvs").symlink_to(REAL_CACHE / "probe-venvs", target_is_directory=True)
    (project.patches / "probes").mkdir()
    (project.patches / "probes" / "requirements.lock").write_bytes((SHIPPED / "probes" / "requirements.lock").read_bytes())
    (project.patches / "probes" / "0001-sub-wrong.yaml").write_text(
        "kind: files\nfiles:\n  vllm/calc.py:\n    contains: ['return b - a']\n")
    project.make_patch(1, "sub-wrong", {"vllm/calc.py": CALC.replace("return a - b", "return b - a")}, "calc: sub",
                       trailers="Origin: vendor\nProbe: probes/0001-sub-wrong.yaml\nLast-Update: 2026-09-01",
                       base="v1.1")
    code, out = run(project, "probe", "check", "1")
    assert code == 1, out
    assert "ok: 0001-sub-wrong.yaml fails without the patch and passes with it" in out  # the probe alone is fine
    assert "    REGRESSION tests/calc/test_calc.py::test_sub" in out
    assert "    fails on both sides (upstream's): tests/calc/test_calc.py::test_known_broken_upstream" in out
    assert "error: 0001-sub-wrong.patch breaks upstream's own tests on v1.1: tests/calc/test_calc.py::test_sub" in out


@pytest.mark.releases
@pytest.mark.probe_venv
def test_the_shipped_0003_probe_covers_both_its_hunks_on_the_pin(release_history: Path) -> None:
    series = Series.load(SHIPPED)
    patch = next(p for p in series.patches if p.number == 3)
    base = git.resolve_commit(release_history, "v0.29.0")
    found = hunk_coverage(release_history, list(series.patches), patch, base=base, ref="v0.29.0", cache=REAL_CACHE)
    assert [h.covered for h in found.hunks] == [True, True], found.says()
    # without the name's strip only the three calls ended before their name's ">" go wrong
    assert "FAIL: 3 of 5 malformed tool calls mishandled" in found.hunks[0].detail
    assert "FAIL: 5 of 5 malformed tool calls mishandled" in found.hunks[1].detail
