"""vpatch status: every patch on every target, landing points by bisection, the table, JSON and exit codes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import KV_V1, PARSER_V1, Project
from conftest import vpatch_cli as run
from conftest import vpatch_json as run_json
from typer.testing import CliRunner

from vpatch.base.paths import cache_dir
from vpatch.commands.cli import app
from vpatch.config.project import Config
from vpatch.probes import Witness
from vpatch.series.files import Series
from vpatch.status import Status, Target, bisect_first, compute_status, resolve_targets
from vpatch.upstream import mirror
from vpatch.verdict import Kind, State

FIX_20 = PARSER_V1.replace("line 20\n", "line 20 fixed\n")
KV_FIX = KV_V1.replace("break", "continue")


def refresh(project: Project) -> Path:
    return mirror.fetch(cache_dir(), project.upstream.url)


def compute_for(project: Project, against: list[str], **kw) -> Status:  # type: ignore[no-untyped-def]
    repo = refresh(project)
    config = Config.load(project.root)
    pin, targets = resolve_targets(repo, config, against)
    return compute_status(repo, Series.load(project.patches).patches, pin=pin, targets=targets, history=True, **kw)


def test_json_reports_each_patch_on_each_target_and_where_it_landed(project: Project) -> None:
    project.make_patch(1, "parser-fix", {"vllm/parser.py": FIX_20}, "Fix the parser")
    project.make_patch(2, "kv-skip-null", {"vllm/kv.py": KV_FIX}, "Skip null blocks")
    landing = project.upstream.commit({"vllm/parser.py": FIX_20}, "Upstream parser fix", tag="v1.1")
    project.upstream.commit({"README": "more\n"}, "Docs", tag="v1.2")
    refresh(project)
    code, doc = run_json(project, "status", "--against", "v1.2", "--against", "v1.1", "--json")
    assert code == 0, doc
    assert doc["pin"]["ref"] == "v1.0" and len(doc["pin"]["commit"]) == 40
    assert doc["targets"] == ["v1.0", "v1.1", "v1.2"]  # oldest first, the pin included
    parser, kv = doc["patches"]
    assert (parser["number"], parser["slug"], parser["file"]) == (1, "parser-fix", "0001-parser-fix.patch")
    assert {ref: r["state"] for ref, r in parser["results"].items()} == {"v1.0": "needed", "v1.1": "landed", "v1.2": "landed"}
    assert parser["results"]["v1.1"]["decided_by"] == "reverse-apply"
    assert parser["landed_in"]["ref"] == "v1.1"
    assert parser["landed_in"]["commit"] == landing and parser["landed_in"]["release"] == "v1.1"
    assert {r["state"] for r in kv["results"].values()} == {"needed"}
    assert kv["landed_in"] is None
    assert doc["probes"] == {"run": 0, "cached": 0, "errors": 0, "problems": []}


def test_table_shows_states_evidence_and_landing_lines(project: Project) -> None:
    project.make_patch(1, "parser-fix", {"vllm/parser.py": FIX_20}, "Fix the parser")
    project.upstream.commit({"vllm/parser.py": FIX_20}, "Upstream parser fix")
    refresh(project)
    code, out = run(project, "status")  # defaults: the pin, the newest release (the pin here), main
    assert code == 0, out
    assert "v1.0 (pin)" in out and "main" in out
    assert "needed" in out and "applies cleanly" in out and "reverse-applies" in out
    assert "0001-parser-fix.patch: landed in main" in out
    assert "on main, in no release yet" in out


def test_exit_codes(project: Project) -> None:
    project.make_patch(1, "parser-fix", {"vllm/parser.py": FIX_20}, "Fix the parser")
    assert run(project, "status", "--exit-code")[0] == 0
    project.upstream.commit({"vllm/parser.py": FIX_20}, "Upstream parser fix", tag="v1.1")
    refresh(project)
    assert run(project, "status", "--exit-code")[0] == 3
    project.make_patch(2, "parser-other", {"vllm/parser.py": PARSER_V1.replace("line 20\n", "line 20 other\n")}, "Other")
    assert run(project, "status", "--exit-code")[0] == 4
    assert run(project, "status")[0] == 0  # without --exit-code findings are not failures
    code, out = run(project, "status", "--against", "v9.9")
    assert code == 1 and "unknown upstream ref 'v9.9'" in out


def test_partial_and_conflict_are_named_in_the_table(project: Project) -> None:
    both = PARSER_V1.replace("line 5\n", "line 5 fixed\n").replace("line 35\n", "line 35 fixed\n")
    project.make_patch(1, "parser-twice", {"vllm/parser.py": both}, "Fix the parser twice")
    project.make_patch(2, "kv-skip-null", {"vllm/kv.py": KV_FIX}, "Skip null blocks")
    project.upstream.commit({"vllm/parser.py": PARSER_V1.replace("line 5\n", "line 5 fixed\n"),
                             "vllm/kv.py": KV_V1.replace("break", "return")}, "Upstream changes", tag="v1.1")
    refresh(project)
    code, doc = run_json(project, "status", "--against", "v1.1", "--json", "--exit-code")
    assert code == 4
    first, second = doc["patches"]
    assert first["results"]["v1.1"]["state"] == "partial"
    assert first["results"]["v1.1"]["hunks"]["landed"] == ["vllm/parser.py hunk 1 (@@ -2,7 +2,7 @@)"]
    assert first["results"]["v1.1"]["summary"] == "1/2 hunks upstream: parser.py #1"
    # what an update does with it is its disposition, with the narrowing's proof (not a count of hunks)
    made = first["results"]["v1.1"]["disposition"]
    assert made["action"] == "narrow" and made["dropped_hunks"][0]["hunk"] == "vllm/parser.py hunk 1 (@@ -2,7 +2,7 @@)"
    assert made["proof"] and ("reverse-applies" in made["proof"] or "identical files" in made["proof"]), made
    assert second["results"]["v1.1"]["state"] == "conflict"
    assert second["results"]["v1.1"]["disposition"]["action"] == "stop"  # 4: a person resolves it
    assert first["landed_in"] is None


def test_bisection_finds_the_landing_commit_in_100_commits_within_log2_checks(project: Project) -> None:
    project.make_patch(1, "parser-fix", {"vllm/parser.py": FIX_20}, "Fix the parser")
    content = PARSER_V1
    landing = ""
    for i in range(1, 101):
        if i == 63:
            content = content.replace("line 20\n", "line 20 fixed\n")
        content = content.replace(f"line {40 - (i % 10)}\n" if i % 2 else "NOPE", f"line {40 - (i % 10)}\n")
        sha = project.upstream.commit({"vllm/parser.py": content, "NOTES": f"commit {i}\n"}, f"Upstream commit {i}",
                                      tag="v2.0" if i == 80 else None)
        if i == 63:
            landing = sha
    status = compute_for(project, ["main"])
    (row,) = status.patches
    assert [v.state for v in row.results] == [State.NEEDED, State.LANDED]
    assert row.landed_in is not None and row.landed_in.commit == landing
    assert row.landed_in.candidates == 100
    assert row.landed_in.checks <= math.ceil(math.log2(100)) + 2
    assert status.bisect_checks == row.landed_in.checks
    assert row.landed_in.release == "v2.0"  # the first release tag that contains it


def test_bisect_first_counts_its_checks() -> None:
    line = [f"c{i}" for i in range(100)]
    for first in (0, 1, 50, 98, 99):
        asked: list[str] = []

        def landed(c: str, asked: list[str] = asked, first: int = first) -> bool:
            asked.append(c)
            return int(c[1:]) >= first

        found, checks = bisect_first(line, landed)
        assert found == f"c{first}" and checks == len(asked) <= 7


def test_probe_results_are_counted_and_the_probe_decides(project: Project) -> None:
    # a files probe: the fix is there when kv.py skips null blocks, whichever way the code around it says so
    (project.patches / "probes").mkdir()
    (project.patches / "probes" / "kv.yaml").write_text("kind: files\nfiles:\n  vllm/kv.py:\n    contains: [continue]\n")
    project.make_patch(1, "kv-skip-null", {"vllm/kv.py": KV_FIX}, "Skip null blocks",
                       trailers="Origin: vendor\nProbe: probes/kv.yaml")
    fixed = project.upstream.commit({"vllm/kv.py": KV_V1.replace("break", "continue  # fixed differently")},
                                    "Fix kv differently", tag="v1.1")
    repo = refresh(project)
    first = compute_for(project, ["v1.1"], evidence=Witness(repo, Config.load(project.root)))
    (row,) = first.patches
    assert [v.state for v in row.results] == [State.NEEDED, State.LANDED]
    decided = row.results[1].decided_by
    assert decided is not None and decided.kind is Kind.PROBE  # the diff neither applies nor reverse-applies on v1.1
    assert row.landed_in is not None and row.landed_in.commit == fixed
    assert (first.probes_run, first.probes_cached) == (3, 0)  # the pin, the pin + the patch (the validation), v1.1
    second = compute_for(project, ["v1.1"], evidence=Witness(repo, Config.load(project.root)))
    assert (second.probes_run, second.probes_cached) == (0, 3)


def test_default_targets_are_pin_newest_release_and_branch(project: Project) -> None:
    project.upstream.commit({"README": "a\n"}, "a", tag="v1.1")
    project.upstream.commit({"README": "b\n"}, "b", tag="v1.2rc1")
    project.upstream.commit({"README": "c\n"}, "c")
    repo = refresh(project)
    pin, targets = resolve_targets(repo, Config.load(project.root))
    assert pin.ref == "v1.0"
    assert [t.ref for t in targets] == ["v1.0", "v1.1", "main"]
    assert all(isinstance(t, Target) and len(t.commit) == 40 for t in targets)


def test_a_second_status_runs_no_probe(project: Project) -> None:
    (project.patches / "probes").mkdir()
    (project.patches / "probes" / "kv.yaml").write_text(
        "kind: files\nfiles:\n  vllm/kv.py:\n    contains: [continue]\n")
    project.make_patch(1, "kv-skip-null", {"vllm/kv.py": KV_FIX}, "Skip null blocks",
                       trailers="Origin: vendor\nProbe: probes/kv.yaml")
    project.upstream.commit({"vllm/kv.py": KV_V1.replace("break", "continue") + "# upstream's own way\n"},
                            "Fix kv upstream", tag="v1.1")
    refresh(project)
    first = json.loads(run(project, "status", "--against", "v1.1", "--json")[1])
    assert first["probes"] == {"run": 3, "cached": 0, "errors": 0, "problems": []}  # pin, pin + patch, v1.1
    assert first["patches"][0]["results"]["v1.1"]["decided_by"] == "probe"
    second = json.loads(run(project, "status", "--against", "v1.1", "--json")[1])
    assert second["probes"] == {"run": 0, "cached": 3, "errors": 0, "problems": []}
    assert second["patches"][0]["results"] == first["patches"][0]["results"]
    code, out = run(project, "status", "--against", "v1.1")
    assert code == 0 and "probes: 0 run, 3 from the cache" in out


def test_a_broken_probe_is_an_error_and_the_text_decides(project: Project) -> None:
    (project.patches / "probes").mkdir()
    (project.patches / "probes" / "kv.yaml").write_text("kind: nonsense\n")
    project.make_patch(1, "kv-skip-null", {"vllm/kv.py": KV_FIX}, "Skip null blocks",
                       trailers="Origin: vendor\nProbe: probes/kv.yaml")
    code, doc = run_json(project, "status", "--json")
    assert code == 0, doc
    result = doc["patches"][0]["results"]["v1.0"]
    assert result["state"] == "needed" and result["decided_by"] == "forward-apply"
    assert [ev["says"] for ev in result["evidence"] if ev["kind"] == "probe"] == ["unavailable"]


# --- the real release history with the shipped series ----------------------------------------

ROOT = Path(__file__).resolve().parents[2]


def _first_landed(patch: dict, targets: list[str]) -> str | None:  # type: ignore[type-arg]
    return next((ref for ref in targets if patch["results"][ref]["state"] == "landed"), None)


@pytest.mark.releases
def test_shipped_series_on_the_real_release_history(release_history: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from conftest import REAL_CACHE

    if not list((ROOT / "patches").glob("*.patch")):
        pytest.skip("the shipped series (issue 3) is not in patches/ yet")
    monkeypatch.setenv("VPATCH_CACHE", str(REAL_CACHE))  # the real history and the probe environment
    against = ["v0.30.0", "v0.31.0", "v0.32.0", "v0.33.0"]
    result = CliRunner().invoke(app, ["--project", str(ROOT), "status", "--json",
                                      *[a for ref in against for a in ("--against", ref)]])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    targets = doc["targets"]
    assert targets == ["v0.29.0", *against] and doc["pin"]["ref"] == "v0.29.0"
    by_number = {p["number"]: p for p in doc["patches"]}
    expected_first = {1: "v0.31.0", 2: "v0.30.0"}
    # 0003 lands nowhere: v0.33.0's own parser rewrite streams a malformed call's name with its newline, which
    # the probe (entering through the server's adapter) sees; its remaining hunk no longer applies there.
    parser = by_number[3]
    assert parser["landed_in"] is None
    assert [parser["results"][ref]["state"] for ref in targets] == ["needed"] * 4 + ["conflict"], parser["results"]
    probe = next(ev for ev in parser["results"]["v0.33.0"]["evidence"] if ev["kind"] == "probe")
    assert probe["says"] == "not-landed", probe
    for number, first in expected_first.items():
        patch = by_number[number]
        assert _first_landed(patch, targets) == first, patch["results"]
        assert patch["landed_in"]["ref"] == first and patch["landed_in"]["release"] == first
        for ref in targets[targets.index(first):]:
            assert patch["results"][ref]["state"] == "landed", (number, ref, patch["results"][ref])
        for ref in targets[:targets.index(first)]:
            before = patch["results"][ref]
            assert before["state"] in ("needed", "partial", "conflict"), (number, ref, before)
            assert before["evidence"], "a verdict without reasons"
    # The Mamba case: the probe decides on v0.30.0 although the old diff still applies there.
    mamba = by_number[2]["results"]["v0.30.0"]
    assert mamba["decided_by"] == "probe"
    assert mamba["applies"] in ("clean", "offsets")
    assert "diff still applies" in mamba["summary"]
    patch_id = next(ev for ev in mamba["evidence"] if ev["kind"] == "patch-id")
    assert patch_id["says"] == "unavailable" and "release history has no per-commit diffs" in patch_id["detail"]

    # Asked only about v0.33.0, the landing points are bisected over the release commits in between.
    result = CliRunner().invoke(app, ["--project", str(ROOT), "status", "--json", "--against", "v0.33.0"])
    assert result.exit_code == 0, result.output
    jumped = {p["number"]: p["landed_in"] for p in json.loads(result.stdout)["patches"]}
    for number, first in expected_first.items():
        assert jumped[number]["commit"] == doc["commits"][first], (number, jumped[number])
        assert jumped[number]["release"] == first and jumped[number]["candidates"] == 4
        assert jumped[number]["checks"] <= 3


def test_targets_older_than_the_pin_do_not_set_the_exit_code(project: Project) -> None:
    project.make_patch(1, "parser-fix", {"vllm/parser.py": FIX_20}, "Fix the parser")
    old = project.upstream.commit({"vllm/parser.py": PARSER_V1.replace("line 20\n", "line 20 old\n")}, "Old")
    project.upstream.commit({"vllm/parser.py": PARSER_V1}, "Back", tag="v1.1")
    from conftest import write_config

    write_config(project.root, project.upstream.url, ref="v1.1")
    refresh(project)
    code, doc = run_json(project, "status", "--against", old, "--json", "--exit-code", "--no-probes")
    assert doc["targets"] == [old, "v1.1"]
    assert doc["patches"][0]["results"][old]["state"] == "conflict"
    assert code == 0
