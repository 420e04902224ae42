"""vpatch update --to TARGET --furthest on toy upstreams: as far as the series allows, what blocks, atomic under kill."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from conftest import KV_FIXED, PARSER_FIXED, PARSER_V1, Project, git
from conftest import vpatch_cli as run
from helpers import killat
from helpers.project import commit_all, release, state_of

from vpatch import update as core
from vpatch.config.project import Config


def run_json(project: Project, *args: str) -> tuple[int, dict]:
    """vpatch with --json in this process: its exit code and the document on stdout (progress goes to stderr)."""
    from typer.testing import CliRunner

    from vpatch.commands.cli import app

    result = CliRunner().invoke(app, ["--project", str(project.root), *args, "--json"])
    assert result.stdout.startswith("{"), result.output
    return result.exit_code, json.loads(result.stdout)


PARSER_CONFLICT = PARSER_V1.replace("line 20\n", "line twenty\n")  # upstream rewrites the line 0002 changes


@pytest.fixture
def two(project: Project) -> Project:
    """0001 (kv) and 0002 (parser) on v1.0, committed."""
    project.make_patch(1, "kv-skip-null", {"vllm/kv.py": KV_FIXED}, "Skip null blocks")
    project.make_patch(2, "parser-fix", {"vllm/parser.py": PARSER_FIXED}, "Fix the parser")
    commit_all(project)
    return project


def lands_then_conflicts(project: Project) -> None:
    """v1.1 lands 0001; v1.2 rewrites the parser line 0002 changes (a conflict); v1.3 changes nothing more."""
    release(project, {"vllm/kv.py": KV_FIXED}, "v1.1")
    release(project, {"vllm/parser.py": PARSER_CONFLICT}, "v1.2")
    release(project, {"README": "toy vllm 1.3\n"}, "v1.3")


def test_furthest_goes_to_the_last_release_before_the_conflict_and_names_it(two: Project) -> None:
    lands_then_conflicts(two)
    code, out = run(two, "update", "--to", "v1.3", "--furthest")
    assert code == 9, out
    assert "committed" in out and "furthest: the pin went to v1.1, short of the target v1.3" in out
    assert "blocked at v1.2" in out
    assert "0002-parser-fix.patch  [conflict] from v1.2" in out
    # the hint names the target asked for: an update to v1.2 alone would stop short of it
    assert "a person runs: vpatch update --to v1.3: it stops at 0002-parser-fix.patch (from v1.2 on)" in out
    config = Config.load(two.root)
    assert config.pin.ref == "v1.1" and config.pin.commit == git(two.upstream.path, "rev-parse", "v1.1").strip()
    assert sorted(p.name for p in two.patches.iterdir()) == ["0002-parser-fix.patch", "RETIRED.md"]
    message = git(two.root, "log", "-1", "--format=%B")
    assert message.startswith("Update upstream pin v1.0 -> v1.1: drop 0001")
    assert "Applied-Upstream: v1.1" in message
    assert "Not further: v1.2 needs a person (the target was v1.3):\n- 0002-parser-fix.patch: conflict from v1.2" in message
    assert git(two.root, "status", "--porcelain") == ""
    # from there the next step is the same conflict: nothing moves, exit 4, and the blocker is named again
    before = state_of(two)
    code, out = run(two, "update", "--to", "v1.3", "--furthest")
    assert code == 4, out
    assert "the pin v1.1 stays" in out and "0002-parser-fix.patch  [conflict] from v1.2" in out
    assert state_of(two) == before


def test_dry_run_shows_the_same_decision_and_changes_nothing(two: Project) -> None:
    lands_then_conflicts(two)
    before = state_of(two)
    code, planned = run_json(two, "update", "--to", "v1.3", "--furthest", "--dry-run")
    assert code == 9, planned
    assert state_of(two) == before
    assert not (two.root / ".git" / "vpatch-update").exists()
    code, done = run_json(two, "update", "--to", "v1.3", "--furthest")
    assert code == 9, done
    assert planned["outcome"] == "planned" and done["outcome"] == "committed"
    for key in ("pin", "dropped", "blockers"):
        assert planned[key] == done[key], key
    assert done["pin"]["to"]["ref"] == "v1.1" and done["dropped"] == ["0001-kv-skip-null.patch"]
    [blocker] = done["blockers"]
    assert blocker["file"] == "0002-parser-fix.patch" and blocker["case"] == "conflict" and blocker["ref"] == "v1.2"
    assert done["furthest"]["step"]["ref"] == "v1.1" and done["furthest"]["reached_target"] is False
    # three release candidates: the target in full, then v1.1 and v1.2 by their judging, then v1.1 in full
    assert done["furthest"]["candidates"] == 3 and done["furthest"]["checks"] <= done["furthest"]["bound"] == 4
    assert done["exit_code"] == 9


def test_no_blocker_reaches_the_target_in_one_check(two: Project) -> None:
    release(two, {"vllm/kv.py": KV_FIXED}, "v1.1")
    release(two, {"README": "toy vllm 1.2\n"}, "v1.2")
    code, done = run_json(two, "update", "--to", "v1.2", "--furthest")
    assert code == 0, done
    assert done["pin"]["to"]["ref"] == "v1.2" and done["blockers"] == []
    assert done["furthest"]["checks"] == 1 and done["furthest"]["reached_target"] is True
    assert "Not further" not in git(two.root, "log", "-1", "--format=%B")


def test_furthest_needs_to_and_refuses_a_downgrade_flag(two: Project) -> None:
    code, out = run(two, "update", "--furthest", "--continue")
    assert code == 2 and "--continue takes none of --furthest" in out
    code, out = run(two, "update", "--furthest")
    assert code == 2 and "they need --to REF" in out
    code, out = run(two, "update", "--to", "v1.0", "--furthest", "--allow-downgrade")
    assert code == 2


# --- a tracked branch: bisection over the first-parent commits ----------------------------------


def branch_with_blocker(project: Project, commits: int, blocker: int, lands: int) -> list[str]:
    """`commits` first-parent commits on main after v1.0: the kv fix lands at commit `lands`, the parser line 0002
    changes is rewritten at commit `blocker` (1-based; 0: never)."""
    def files(i: int) -> dict[str, str]:
        out = {"progress.txt": f"commit {i}\n"}
        if i == lands:
            out["vllm/kv.py"] = KV_FIXED
        if i == blocker:
            out["vllm/parser.py"] = PARSER_CONFLICT
        return out

    shas = project.upstream.grow((f"upstream commit {i}", files(i)) for i in range(1, commits + 1))
    assert run(project, "fetch")[0] == 0
    return shas


@pytest.mark.parametrize(("commits", "blocker"), [(40, 23), (40, 40), (17, 2), (40, 0)])
def test_branch_bisection_finds_the_last_good_commit_in_log2_plus_2_checks(two: Project, commits: int,
                                                                         blocker: int) -> None:
    shas = branch_with_blocker(two, commits, blocker, lands=1)
    judged: list[str] = []

    def counting(repo, config, series, current, to, target):  # type: ignore[no-untyped-def]
        judged.append(target)  # every check judges its commit once; the real run re-uses the step's judging
        return core.judge_with_status(repo, config, series, current, to, target)

    reach = core.update_furthest(Config.load(two.root), "main", judge=counting)
    choice = reach.choice
    assert len(choice.candidates) == commits and choice.mode == "commits"
    want = shas[blocker - 2] if blocker else shas[-1]
    assert choice.step is not None and choice.step.commit == want
    assert len(judged) == len(choice.checks) <= math.ceil(math.log2(commits)) + 2, judged
    config = Config.load(two.root)
    assert config.pin.commit == want
    assert not (two.patches / "0001-kv-skip-null.patch").exists()  # landed at commit 1: dropped on the way
    if blocker:
        assert reach.exit_code() == 9
        [b] = choice.blockers
        assert (b.file, b.case, b.commit) == ("0002-parser-fix.patch", "conflict", shas[blocker - 1])
        assert config.pin.ref == want[:12]
    else:
        assert reach.exit_code() == 0 and choice.blockers == () and config.pin.ref == "main"


def test_the_search_keeps_its_bound_for_every_blocker_position() -> None:
    """The search alone (furthest.choose) over K candidates with the first blocker at each position N (none: N = K):
    the step is N - 1 and it takes at most ceil(log2 K) + 2 checks. No git here: the candidates are names."""
    from vpatch.update import furthest

    for k in range(1, 65):
        line = [furthest.Candidate(f"c{i}", f"{i:040x}") for i in range(k)]
        for first_bad in range(k + 1):
            def check(c: furthest.Candidate, *, full: bool, n: int = first_bad) -> furthest.CandidateCheck:
                return furthest.CandidateCheck(c, int(c.ref[1:]) < n, full)

            choice = furthest.choose(line[-1], "commits", line, judged=lambda c: check(c, full=False),
                                     full=lambda c: check(c, full=True))
            assert choice.step == (line[first_bad - 1] if first_bad else None), (k, first_bad)
            assert len(choice.checks) <= math.ceil(math.log2(k)) + 2 == choice.bound, (k, first_bad, choice.checks)
            assert choice.step is None or any(c.candidate == choice.step and c.full and c.ok for c in choice.checks)


def test_a_blocker_at_the_first_commit_moves_nothing(two: Project) -> None:
    branch_with_blocker(two, 9, blocker=1, lands=1)
    before = state_of(two)
    code, done = run_json(two, "update", "--to", "main", "--furthest")
    assert code == 4, done
    assert done["outcome"] == "blocked" and done["furthest"]["step"] is None
    assert done["no_local_patch_remains"] is False and done["dropped"] == []
    assert [b["file"] for b in done["blockers"]] == ["0002-parser-fix.patch"]
    assert state_of(two) == before


# --- a kill: the project is as it was, or as the committed step ------------------------------------


def vpatch_process(project: Project, *args: str, kill_at: str | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(killat.HERE), kill_at] if kill_at else [sys.executable, "-m", "vpatch"]
    return subprocess.run([*command, "--project", str(project.root), *args], capture_output=True, text=True)


@pytest.mark.parametrize("step", ["judged", "applied", "prepared"])
def test_kill_before_the_commit_point_leaves_the_project_as_it_was(two: Project, step: str) -> None:
    lands_then_conflicts(two)
    before = state_of(two)
    proc = vpatch_process(two, "update", "--to", "v1.3", "--furthest", kill_at=step)
    assert proc.returncode == -9, proc.stdout + proc.stderr
    assert state_of(two) == before
    proc = vpatch_process(two, "update", "--to", "v1.3", "--furthest")
    assert proc.returncode == 9, proc.stdout + proc.stderr
    assert Config.load(two.root).pin.ref == "v1.1"


def test_kill_at_the_commit_point_finishes_as_the_committed_step_or_undoes(two: Project) -> None:
    lands_then_conflicts(two)
    before = state_of(two)
    assert vpatch_process(two, "update", "--to", "v1.3", "--furthest", kill_at="committed").returncode == -9
    assert vpatch_process(two, "update", "--abort").returncode == 0
    assert state_of(two) == before
    assert vpatch_process(two, "update", "--to", "v1.3", "--furthest", kill_at="committed").returncode == -9
    proc = vpatch_process(two, "update", "--continue")
    assert proc.returncode == 0, proc.stderr
    assert git(two.root, "status", "--porcelain") == ""
    assert Config.load(two.root).pin.ref == "v1.1"
    assert "Not further: v1.2 needs a person" in git(two.root, "log", "-1", "--format=%B")


def test_a_step_whose_probe_no_longer_validates_is_blocked_and_the_search_goes_below(two: Project) -> None:
    """0002's probe needs the patch's line and upstream's `line 1`: v1.2 renames that line, so the probe fails with
    the patch too. The judging passes there (the probe fails without the patch: needed), the full check does not."""
    text = (two.patches / "0002-parser-fix.patch").read_text()
    (two.patches / "0002-parser-fix.patch").write_text(
        text.replace("Last-Update:", "Probe: probes/0002-parser-fix.yaml\nLast-Update:"))
    (two.patches / "probes").mkdir()
    (two.patches / "probes" / "0002-parser-fix.yaml").write_text(
        'kind: files\nfiles:\n  vllm/parser.py:\n    contains: ["line 20 fixed", "line 1\\n"]\n')
    commit_all(two, "a probe for 0002")
    release(two, {"vllm/kv.py": KV_FIXED}, "v1.1")
    release(two, {"vllm/parser.py": PARSER_V1.replace("line 1\n", "line one\n")}, "v1.2")
    release(two, {"README": "toy vllm 1.3\n"}, "v1.3")
    code, done = run_json(two, "update", "--to", "v1.3", "--furthest")
    assert code == 9, done
    assert done["pin"]["to"]["ref"] == "v1.1" and done["dropped"] == ["0001-kv-skip-null.patch"]
    [blocker] = done["blockers"]
    assert (blocker["file"], blocker["case"], blocker["ref"]) == ("0002-parser-fix.patch", "probe", "v1.2")
    assert "does not discriminate for 0002-parser-fix.patch" in blocker["reasons"][0]
    assert blocker["run"].startswith("vpatch probe check 0002")
    # v1.3 in full, v1.2 by its judging (passes), v1.2 in full (refused), then below it in full
    checked = [(c["ref"], c["ok"], c["full"]) for c in done["furthest"]["checked"]]
    assert checked == [("v1.3", False, True), ("v1.2", True, False), ("v1.2", False, True), ("v1.1", True, True)]
