"""One disposition (update/disposition.py) is status's cell, `status --exit-code`, the dry run's row and words and
what the update does, for every case a patch can be in; narrowing finds a dropped hunk's landing with status's
landing search (issue 20, item 4; issue 60)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from conftest import KV_FIXED, KV_V1, PARSER_FIXED, PARSER_V1, Project, git, vpatch_streams
from conftest import vpatch_cli as run
from conftest import vpatch_json as run_json
from helpers.project import commit_all

from vpatch import update, upstream
from vpatch.base import cache_dir
from vpatch.config.project import Config
from vpatch.series import Series
from vpatch.update import Action
from vpatch.verdict import Case

THREE = (PARSER_V1.replace("line 5\n", "line 5 fixed\n")
         .replace("line 20\n", "line 20a\nline 20b\nline 20c\n")
         .replace("line 35\n", "line 35 fixed\n"))
HUNK_2_ONLY = PARSER_V1.replace("line 20\n", "line 20a\nline 20b\nline 20c\n")
VACUOUS = "kind: files\nfiles:\n  vllm/parser.py:\n    not_contains: [\"NEVER\"]\n"


def _kv(project: Project) -> str:
    project.make_patch(1, "kv", {"vllm/kv.py": KV_FIXED}, "Skip null blocks")
    return "0001-kv.patch"


def landed(project: Project) -> str:
    file = _kv(project)
    project.upstream.commit({"vllm/kv.py": KV_FIXED}, "kv: skip null blocks", tag="v1.1")
    return file


def needed(project: Project) -> str:
    file = _kv(project)
    project.upstream.commit({"README": "v1.1\n"}, "v1.1", tag="v1.1")
    return file


def partial(project: Project) -> str:
    project.make_patch(1, "parser-three", {"vllm/parser.py": THREE}, "Fix the parser in three places")
    project.upstream.commit({"vllm/parser.py": HUNK_2_ONLY}, "parser: hunk 2", tag="v1.1")
    return "0001-parser-three.patch"


def conflict(project: Project) -> str:
    file = _kv(project)
    project.upstream.commit({"vllm/kv.py": KV_V1.replace("break", "return")}, "kv: return early", tag="v1.1")
    return file


def moved_lost(project: Project) -> str:
    file = _kv(project)
    project.upstream.commit({"vllm/kv.py": None}, "drop kv.py", tag="v1.1")
    return file


def disputed(project: Project) -> str:
    # the PR the patch names is in a subject upstream, but the diff still applies cleanly: identity vs content
    project.make_patch(1, "parser", {"vllm/parser.py": PARSER_FIXED}, "Fix the parser",
                       trailers="Origin: upstream\nUpstream-PR: 77\nLast-Update: 2026-09-01")
    project.upstream.commit({"README": "readme (#77)\n"}, "Docs touch-up (#77)", tag="v1.1")
    return "0001-parser.patch"


def contradiction(project: Project) -> str:
    file = _kv(project)
    project.upstream.commit({"vllm/kv.py": KV_FIXED}, "kv fixed", tag="v1.0.1")
    project.upstream.commit({"README": "v1.1\n"}, "v1.1", tag="v1.1")
    config = project.root / "vpatch.yaml"
    config.write_text(config.read_text().replace("ref: v1.0", "ref: v1.0.1"))
    return file


def invalid_probe(project: Project) -> str:
    (project.patches / "probes").mkdir()
    (project.patches / "probes" / "parser.yaml").write_text(VACUOUS)
    project.make_patch(1, "parser", {"vllm/parser.py": PARSER_FIXED}, "Fix the parser",
                       trailers="Origin: vendor\nProbe: probes/parser.yaml\nLast-Update: 2026-09-01")
    project.upstream.commit({"README": "v1.1\n"}, "v1.1", tag="v1.1")
    return "0001-parser.patch"


# case -> (the scenario, and what a person sees, written out: status's exit code, the disposition, the verb)
SCENARIOS: dict[Case, tuple[Callable[[Project], str], int, Action, str]] = {
    Case.LANDED: (landed, 3, Action.DROP, "would drop"),
    Case.NEEDED: (needed, 0, Action.CARRY, "would re-apply"),
    Case.PARTIAL: (partial, 3, Action.NARROW, "would narrow"),  # narrowed with proof: no person needed
    Case.CONFLICT: (conflict, 4, Action.STOP, "would stop at"),
    Case.MOVED_LOST: (moved_lost, 4, Action.STOP, "would stop at"),
    Case.DISPUTED: (disputed, 4, Action.STOP, "would stop at"),
    Case.CONTRADICTION: (contradiction, 4, Action.STOP, "would stop at"),
    Case.INVALID_PROBE: (invalid_probe, 4, Action.REFUSE, "would refuse"),  # refused: the plan, then an error
}


def test_every_case_has_a_scenario() -> None:
    assert set(SCENARIOS) == set(Case)


@pytest.mark.parametrize("case", list(Case), ids=[c.value for c in Case])
def test_one_disposition_is_status_the_dry_run_and_the_update(project: Project, case: Case) -> None:
    scenario, code, action, words = SCENARIOS[case]
    file = scenario(project)
    commit_all(project)
    assert run(project, "fetch")[0] == 0

    # status: the disposition on the target, and the exit code derived from it
    status_code, doc = run_json(project, "status", "--json", "--exit-code", "--against", "v1.1")
    assert status_code == code, doc
    (entry,) = doc["patches"]
    said = entry["results"]["v1.1"]["disposition"]
    assert (said["action"], said["case"]) == (action.value, case.value), said
    _, table = run(project, "status", "--against", "v1.1")
    assert words in table, table  # the table says it in the dry run's words
    head = git(project.root, "rev-parse", "HEAD").strip()

    plan_code, plan, plan_err = vpatch_streams(project, "update", "--to", "v1.1", "--dry-run", "--json")
    text_code, text = run(project, "update", "--to", "v1.1", "--dry-run")
    # the dry run prints the same disposition, in the same words
    assert f"  {words:<14} {file}  [{case.label}]" in text, text
    if action is Action.REFUSE:
        # the move is refused, in the dry run as in the real run: the same error naming the patch
        real_code, real = run(project, "update", "--to", "v1.1")
        assert (plan_code, text_code, real_code) == (1, 1, 1), plan + plan_err + text + real
        assert file in real.split("error: ")[1] and text.split("error: ")[1] == real.split("error: ")[1], real
    else:
        (row,) = json.loads(plan)["patches"]
        assert row["disposition"] == said, (row["disposition"], said)
        assert (row["case"], row["state"], row["action"]) == (case.value, case.label, action.value), row
        # a dry run exits as the real run would: 5 where it would stop for a person
        assert plan_code == text_code == (5 if action is Action.STOP else 0), plan + text
        assert (action is Action.NARROW) is (row["narrowing"] is not None)
    assert git(project.root, "rev-parse", "HEAD").strip() == head  # a dry run changes nothing


def test_a_hunk_landed_reverted_and_re_landed_narrows_with_the_re_land_as_its_landing(project: Project) -> None:
    """Hunk 2 lands, is reverted, lands again; the first-parent line is laid out so that a bisection blind to
    the revert stops at the first landing (it did, before status's landing search was used)."""
    project.make_patch(1, "parser-three", {"vllm/parser.py": THREE}, "Fix the parser in three places")
    commit_all(project)
    up = project.upstream
    first = up.commit({"vllm/parser.py": HUNK_2_ONLY}, "parser: split line 20")
    up.commit({"README": "one\n"}, "docs one")
    revert = up.commit({"vllm/parser.py": PARSER_V1},
                       f"Revert \"parser: split line 20\"\n\nThis reverts commit {first}.")
    reland = up.commit({"vllm/parser.py": HUNK_2_ONLY}, "parser: split line 20 again")
    for n in ("two", "three", "four"):
        up.commit({"README": f"{n}\n"}, f"docs {n}")
    git(up.path, "tag", "v1.1")
    assert run(project, "fetch")[0] == 0

    code, doc = run_json(project, "update", "--to", "v1.1", "--dry-run", "--json")
    assert code == 0, doc
    (row,) = doc["patches"]
    assert row["case"] == "partial" and row["narrowing"] is not None, row
    (dropped,) = row["narrowing"]["dropped"]
    assert dropped["name"].startswith("vllm/parser.py hunk 2")
    landing = dropped["landed_in"]
    assert f"first commit {reland[:12]} \"parser: split line 20 again\"" in landing, landing
    assert first[:12] not in landing and revert[:12] not in landing
    # searched after the revert only: the re-land and the three commits after it
    assert "over 4 commits" in landing, landing


def test_the_disposition_of_one_patch_at_one_target_is_status_s(project: Project) -> None:
    """`update.disposition_of`, the one question another command asks (is P landed at T?), answers as status does."""
    file = landed(project)
    commit_all(project)
    assert run(project, "fetch")[0] == 0
    _, doc = run_json(project, "status", "--json", "--against", "v1.1")
    (entry,) = doc["patches"]
    config = Config.load(project.root)
    repo = upstream.open_upstream(config)
    made = update.disposition_of(repo, config, Series.load(config.patches_dir), file, "v1.1", validator=None)
    assert made.action is Action.DROP and made.action.value == entry["results"]["v1.1"]["disposition"]["action"]
    with pytest.raises(update.VpatchError, match=r"no patch 0009-nope\.patch in the series"):
        update.disposition_of(repo, config, Series.load(config.patches_dir), "0009-nope.patch", "v1.1", validator=None)


def test_a_second_status_decides_nothing_again_and_a_changed_probe_decides_again(project: Project) -> None:
    invalid_probe(project)
    commit_all(project)
    assert run(project, "fetch")[0] == 0
    kept = cache_dir() / "dispositions"
    first = json.loads(run(project, "status", "--json", "--against", "v1.1")[1])
    made = set(kept.iterdir())
    assert len(made) == 1  # one target after the pin
    again = json.loads(run(project, "status", "--json", "--against", "v1.1")[1])
    assert again["patches"] == first["patches"] and set(kept.iterdir()) == made  # the probes: from their cache
    # the probe is one of the things a disposition is decided from: changed, it is decided again
    (project.patches / "probes" / "parser.yaml").write_text(VACUOUS.replace("NEVER", "NEVER EVER"))
    commit_all(project)
    run(project, "status", "--json", "--against", "v1.1")
    assert len(set(kept.iterdir()) - made) == 1
