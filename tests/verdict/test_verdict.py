"""Landing verdicts for one patch on one commit: every state and every kind of evidence, on small repos."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import KV_V1, PARSER_V1, Project, git, vpatch_cli

from vpatch.base.paths import cache_dir
from vpatch.probes import ProbeCheck, ProbeOutcome
from vpatch.series.files import Patch, Series
from vpatch.upstream import mirror
from vpatch.verdict.judge import (
    Applies,
    Kind,
    Says,
    State,
    Verdict,
    judge,
    judge_series,
)


def mirror_of(project: Project) -> Path:
    """The project's upstream mirror, fetched after the test's upstream commits."""
    return mirror.fetch(cache_dir(), project.upstream.url)


def commit_of(repo: Path, ref: str) -> str:
    from vpatch import git

    commit = git.resolve_commit(repo, ref)
    assert commit is not None
    return commit


def verdict_on(project: Project, patch_path: Path, ref: str, *, history: bool = True, probe=None) -> Verdict:  # type: ignore[no-untyped-def]
    repo = mirror_of(project)
    patch = Patch.load(patch_path)
    return judge(repo, patch, commit_of(repo, ref), pin=commit_of(repo, "v1.0"), history=history, probe=probe)


def kinds(verdict: Verdict, says: Says) -> set[Kind]:
    return {ev.kind for ev in verdict.evidence if ev.says is says}


FIX_20 = PARSER_V1.replace("line 20\n", "line 20 fixed\n")


def test_needed_applies_cleanly_on_the_pin(project: Project) -> None:
    p = project.make_patch(1, "parser-fix", {"vllm/parser.py": FIX_20}, "Fix the parser")
    v = verdict_on(project, p, "v1.0")
    assert v.state is State.NEEDED
    assert v.applies is Applies.CLEAN
    assert v.decided_by is not None and v.decided_by.kind is Kind.FORWARD
    assert kinds(v, Says.LANDED) == set()


def test_needed_with_offsets_names_the_moved_hunk(project: Project) -> None:
    p = project.make_patch(1, "parser-fix", {"vllm/parser.py": FIX_20}, "Fix the parser")
    project.upstream.commit({"vllm/parser.py": "header a\nheader b\nheader c\n" + PARSER_V1}, "Add a header", tag="v1.1")
    v = verdict_on(project, p, "v1.1")
    assert v.state is State.NEEDED
    assert v.applies is Applies.OFFSETS
    assert "hunk 1 at line 20 (+3)" in str(v.decided_by)


def test_needed_only_with_a_3way_merge(project: Project) -> None:
    p = project.make_patch(1, "parser-fix", {"vllm/parser.py": FIX_20}, "Fix the parser")
    project.upstream.commit({"vllm/parser.py": PARSER_V1.replace("line 22\n", "line 22 upstream\n")}, "Touch 22", tag="v1.1")
    v = verdict_on(project, p, "v1.1")
    assert v.state is State.NEEDED
    assert v.applies is Applies.THREE_WAY
    assert "3-way" in str(v.decided_by)


def test_conflict_names_the_hunk_that_does_not_apply(project: Project) -> None:
    p = project.make_patch(1, "parser-fix", {"vllm/parser.py": FIX_20}, "Fix the parser")
    project.upstream.commit({"vllm/parser.py": PARSER_V1.replace("line 20\n", "line 20 otherwise\n")}, "Rewrite 20", tag="v1.1")
    v = verdict_on(project, p, "v1.1")
    assert v.state is State.CONFLICT
    assert v.applies is Applies.NO
    assert v.conflict_hunks == ("vllm/parser.py hunk 1 (@@ -17,7 +17,7 @@)",)
    assert "do not apply: vllm/parser.py hunk 1" in str(v.decided_by)


def test_verbatim_landing_without_a_probe_is_landed_by_reverse_apply(project: Project) -> None:
    p = project.make_patch(1, "parser-fix", {"vllm/parser.py": FIX_20}, "Fix the parser")
    # upstream writes the same content in a commit of its own that also touches another file
    project.upstream.commit({"vllm/parser.py": FIX_20, "README": "toy vllm, now fixed\n"}, "Upstream fix", tag="v1.1")
    v = verdict_on(project, p, "v1.1")
    assert v.state is State.LANDED
    assert v.decided_by is not None and v.decided_by.kind is Kind.REVERSE


def test_cherry_picked_upstream_is_landed_by_patch_id(project: Project) -> None:
    p = project.make_patch(1, "parser-fix", {"vllm/parser.py": FIX_20}, "Fix the parser")
    picked = project.upstream.commit({"vllm/parser.py": FIX_20}, "Fix the parser (picked)")
    # a later edit next to it: the diff no longer reverse-applies, only the patch-id still matches
    later = FIX_20.replace("line 21\n", "line 21 later\n")
    project.upstream.commit({"vllm/parser.py": later}, "Later edit", tag="v1.1")
    v = verdict_on(project, p, "v1.1")
    assert v.state is State.LANDED
    assert v.decided_by is not None and v.decided_by.kind is Kind.PATCH_ID
    assert picked[:12] in v.decided_by.detail
    assert Kind.REVERSE in kinds(v, Says.NOT_LANDED)


def test_upstream_pr_in_a_reachable_subject_is_landed_evidence(project: Project) -> None:
    p = project.make_patch(1, "kv-skip-null", {"vllm/kv.py": KV_V1.replace("break", "continue")}, "Skip null blocks",
                           trailers="Origin: vendor\nUpstream-PR: 4242")
    # upstream fixes it its own way, squash-merged with the PR number in the subject
    own_way = KV_V1.replace("        if b is None:\n            break\n", "        if b is not None:\n            pass\n")
    project.upstream.commit({"vllm/kv.py": own_way},
                            "[Core] Free blocks past null gaps (#4242)", tag="v1.1")
    v = verdict_on(project, p, "v1.1")
    assert v.state is State.LANDED
    assert v.decided_by is not None and v.decided_by.kind is Kind.UPSTREAM_PR
    assert "(#4242)" in v.decided_by.detail


def test_release_history_says_patch_id_and_pr_are_unavailable(project: Project) -> None:
    p = project.make_patch(1, "kv-skip-null", {"vllm/kv.py": KV_V1.replace("break", "continue")}, "Skip null blocks",
                           trailers="Origin: vendor\nUpstream-PR: 4242")
    project.upstream.commit({"README": "other\n"}, "Something else (#4242)", tag="v1.1")
    v = verdict_on(project, p, "v1.1", history=False)
    assert v.state is State.NEEDED  # the PR is in a subject, but the release source must not guess from it
    unavailable = {ev.kind: ev.detail for ev in v.evidence if ev.says is Says.UNAVAILABLE}
    assert "release history has no per-commit diffs" in unavailable[Kind.PATCH_ID]
    assert "release history has no per-commit diffs" in unavailable[Kind.UPSTREAM_PR]


def test_partly_landed_patch_is_partial_and_names_the_hunks(project: Project) -> None:
    both = PARSER_V1.replace("line 5\n", "line 5 fixed\n").replace("line 35\n", "line 35 fixed\n")
    p = project.make_patch(1, "parser-fix", {"vllm/parser.py": both}, "Fix the parser twice")
    project.upstream.commit({"vllm/parser.py": PARSER_V1.replace("line 5\n", "line 5 fixed\n")}, "Half of it", tag="v1.1")
    v = verdict_on(project, p, "v1.1")
    assert v.state is State.PARTIAL
    assert v.landed_hunks == ("vllm/parser.py hunk 1 (@@ -2,7 +2,7 @@)",)
    assert v.needed_hunks == ("vllm/parser.py hunk 2 (@@ -32,7 +32,7 @@)",)
    assert "upstream already has vllm/parser.py hunk 1" in str(v.decided_by)


def probe_says(outcome: ProbeOutcome, detail: str = ""):  # type: ignore[no-untyped-def]
    return lambda patch, commit, moved: ProbeCheck(outcome, detail)


def test_probe_pass_decides_landed_although_the_diff_still_applies(project: Project) -> None:
    # the Mamba case: upstream fixed the behaviour differently, the old diff still applies cleanly
    p = project.make_patch(1, "kv-skip-null", {"vllm/kv.py": KV_V1.replace("break", "continue")}, "Skip null blocks")
    project.upstream.commit({"vllm/kv.py": KV_V1 + "\n\ndef free_gaps(blocks):\n    pass\n"}, "Fixed elsewhere", tag="v1.1")
    v = verdict_on(project, p, "v1.1", probe=probe_says(ProbeOutcome.PASS, "3 blocks held"))
    assert v.state is State.LANDED
    assert v.decided_by is not None and v.decided_by.kind is Kind.PROBE
    assert "3 blocks held" in v.decided_by.detail
    assert v.applies is Applies.CLEAN
    assert any(ev.kind is Kind.FORWARD and "applies cleanly" in ev.detail for ev in v.evidence)


def test_probe_error_counts_neither_way(project: Project) -> None:
    p = project.make_patch(1, "parser-fix", {"vllm/parser.py": FIX_20}, "Fix the parser")
    project.upstream.commit({"vllm/parser.py": FIX_20}, "Upstream fix", tag="v1.1")
    needed = verdict_on(project, p, "v1.0", probe=probe_says(ProbeOutcome.ERROR, "torch missing"))
    landed = verdict_on(project, p, "v1.1", probe=probe_says(ProbeOutcome.ERROR, "torch missing"))
    assert (needed.state, landed.state) == (State.NEEDED, State.LANDED)
    assert landed.decided_by is not None and landed.decided_by.kind is Kind.REVERSE
    for v in (needed, landed):
        assert [ev.says for ev in v.evidence if ev.kind is Kind.PROBE] == [Says.UNAVAILABLE]
        assert "torch missing" in v.evidence[0].detail


def test_probe_fail_overrides_textual_landing(project: Project) -> None:
    p = project.make_patch(1, "parser-fix", {"vllm/parser.py": FIX_20}, "Fix the parser")
    project.upstream.commit({"vllm/parser.py": FIX_20}, "Upstream fix", tag="v1.1")
    v = verdict_on(project, p, "v1.1", probe=probe_says(ProbeOutcome.FAIL))
    assert v.state is State.CONFLICT
    assert Kind.REVERSE in kinds(v, Says.LANDED)
    assert "a person must look" in v.evidence[-1].detail


def test_later_patch_is_judged_on_top_of_the_earlier_needed_one(project: Project) -> None:
    first = FIX_20
    second = FIX_20.replace("line 21\n", "line 21 fixed\n")
    project.make_patch(1, "one", {"vllm/parser.py": first}, "One")
    project.make_patch(2, "two", {"vllm/parser.py": second}, "Two on top of one")
    # make 0002 a diff against v1.0 + 0001, as `vpatch export` would write it
    scratch = project.root.parent / "scratch-2"
    from conftest import git

    git(scratch, "checkout", "-q", "--detach", "HEAD~1")
    git(scratch, "apply", "--index", str(project.patches / "0001-one.patch"))
    git(scratch, "commit", "-q", "-m", "one")
    (scratch / "vllm/parser.py").write_text(second)
    git(scratch, "commit", "-q", "-a", "-m", "Two on top of one\n\nWhy.\n\nOrigin: vendor\n")
    raw = git(scratch, "-c", "core.abbrev=40", "format-patch", "-1", "--stdout", "--full-index", "--no-signature", "HEAD")
    (project.patches / "0002-two.patch").write_text(raw)

    repo = mirror_of(project)
    series = Series.load(project.patches)
    pin = commit_of(repo, "v1.0")
    stacked = judge_series(repo, series.patches, pin, pin=pin, history=True)
    assert [v.state for v in stacked] == [State.NEEDED, State.NEEDED]
    assert stacked[1].applies is Applies.CLEAN
    alone = judge(repo, series.patches[1], pin, pin=pin, history=True)
    assert alone.applies is not Applies.CLEAN  # alone its context is missing
    only = judge_series(repo, series.patches, pin, pin=pin, history=True, only={"0002-two.patch"})
    assert [v.patch for v in only] == ["0002-two.patch"] and only[0].applies is Applies.CLEAN


def test_textual_checks_leave_the_mirror_untouched(project: Project) -> None:
    p = project.make_patch(1, "parser-fix", {"vllm/parser.py": FIX_20}, "Fix the parser")
    repo = mirror_of(project)
    from conftest import git

    before = git(repo, "for-each-ref"), sorted(x.name for x in repo.iterdir())
    verdict_on(project, p, "v1.0")
    assert (git(repo, "for-each-ref"), sorted(x.name for x in repo.iterdir())) == before
    assert not (repo / "index").exists()


@pytest.mark.parametrize("outcome", list(ProbeOutcome))
def test_every_verdict_has_evidence_that_decided_it(project: Project, outcome: ProbeOutcome) -> None:
    p = project.make_patch(1, "parser-fix", {"vllm/parser.py": FIX_20}, "Fix the parser")
    v = verdict_on(project, p, "v1.0", probe=probe_says(outcome))
    assert v.decided_by is not None


# Reverse-apply is location-aware: a post-image found in a copy elsewhere in the file is no landing while the
# hunk's own place still holds the pre-image (a false drop otherwise), and moved code is still found.

FIX_5_20 = FIX_20.replace("line 5\n", "line 5 fixed\n")


def block(first: int, last: int, fixed: int | None = None) -> str:
    """Lines first..last of the parser, `fixed` with its fix: a copy of a hunk's image."""
    return "".join(f"line {i}" + (" fixed" if i == fixed else "") + "\n" for i in range(first, last + 1))


def test_a_copy_of_the_post_image_far_away_is_not_a_landing(project: Project) -> None:
    p = project.make_patch(1, "parser-fix", {"vllm/parser.py": FIX_20}, "Fix the parser")
    # upstream copies the block (lines 17-23) below and fixes only the copy; line 20 itself is as before
    project.upstream.commit({"vllm/parser.py": PARSER_V1 + "copy\n" + block(17, 23, fixed=20)}, "Copy", tag="v1.1")
    v = verdict_on(project, p, "v1.1")
    assert v.state is State.NEEDED
    reverse = next(ev for ev in v.evidence if ev.kind is Kind.REVERSE)
    assert reverse.says is Says.NOT_LANDED
    assert "post-image at hunk 1 at line 42 (+25)" in reverse.detail and "not a landing" in reverse.detail


def test_moved_code_with_the_change_is_still_landed(project: Project) -> None:
    p = project.make_patch(1, "parser-fix", {"vllm/parser.py": FIX_20}, "Fix the parser")
    # upstream moves the block to the end of the file, with the fix: the pre-image is nowhere
    moved = block(1, 16) + block(24, 40) + block(17, 23, fixed=20)
    project.upstream.commit({"vllm/parser.py": moved}, "Move and fix", tag="v1.1")
    v = verdict_on(project, p, "v1.1")
    assert v.state is State.LANDED
    assert v.decided_by is not None and v.decided_by.kind is Kind.REVERSE


def test_one_hunk_landed_and_one_only_copied_is_partial_not_landed(project: Project) -> None:
    p = project.make_patch(1, "parser-fix", {"vllm/parser.py": FIX_5_20}, "Fix the parser twice")
    # hunk 1 (line 5) lands for real; hunk 2's post-image exists only as a copy far below line 20
    upstream = PARSER_V1.replace("line 5\n", "line 5 fixed\n") + "copy\n" + block(17, 23, fixed=20)
    project.upstream.commit({"vllm/parser.py": upstream}, "Half, and a copy", tag="v1.1")
    v = verdict_on(project, p, "v1.1")
    assert v.state is State.PARTIAL
    assert v.landed_hunks == ("vllm/parser.py hunk 1 (@@ -2,7 +2,7 @@)",)
    assert v.needed_hunks == ("vllm/parser.py hunk 2 (@@ -17,7 +17,7 @@)",)


def test_post_image_nearer_than_a_stale_pre_image_copy_is_disputed(project: Project) -> None:
    p = project.make_patch(1, "parser-fix", {"vllm/parser.py": FIX_20}, "Fix the parser")
    # the fix is at its place, and an unfixed copy of the block sits far below: text cannot tell which one
    # the patch meant, so a person looks (never landed, never applied blindly)
    upstream = FIX_20 + "copy\n" + block(17, 23)
    project.upstream.commit({"vllm/parser.py": upstream}, "Fix, and an old copy", tag="v1.1")
    v = verdict_on(project, p, "v1.1")
    assert v.state is State.DISPUTED
    assert v.decided_by is not None and "both the pre-image and the post-image" in v.decided_by.detail


def test_update_keeps_a_patch_whose_post_image_is_only_copied(project: Project) -> None:
    project.make_patch(1, "parser-fix", {"vllm/parser.py": FIX_20}, "Fix the parser")
    git(project.root, "init", "-q", "-b", "main")
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "project")
    project.upstream.commit({"vllm/parser.py": PARSER_V1 + "copy\n" + block(17, 23, fixed=20)}, "Copy", tag="v1.1")
    assert vpatch_cli(project, "fetch")[0] == 0
    code, out = vpatch_cli(project, "status", "--against", "v1.1", "--exit-code")
    assert code == 0, out  # nothing landed (3), nothing for a person (4)
    code, out = vpatch_cli(project, "update", "--to", "v1.1")
    assert code == 0, out
    assert "drop" not in out and (project.patches / "0001-parser-fix.patch").exists()
    assert "ref: v1.1" in (project.root / "vpatch.yaml").read_text()
