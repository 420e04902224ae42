"""Verdicts for every patch x target, and where each landed patch landed: first commit (bisected) and release.

Library API (used by `vpatch status` and `vpatch update`):

    pin, targets = resolve_targets(repo, config, against=["v0.30.0"])   # [] -> the defaults
    with probes.Witness(repo, config) as evidence:
        report = compute_status(repo, series.patches, pin=pin, targets=targets, history=config.upstream.source == "git",
                         branch=config.upstream.branch, evidence=evidence)

`compute_status` returns a frozen `Status`: `targets` oldest first (the pin among them), one `PatchStatus` per
patch with a `Verdict` per target (`PatchStatus.at(ref)`), `landed_in` (a `Landing` or None), the
number of probes run and answered from the cache. What an update does with each patch there (and so
`--exit-code`) is the disposition, decided from this in update/disposition.py.

Landing point: the first target (oldest first, by ancestry) where the patch is LANDED. When an earlier
target is not landed, the first-parent commits between the nearest such ancestor (the pin, for every target
it is an ancestor of) and the landed target are bisected with the full verdict (probe included)
as the test, so K commits cost about log2(K) checks; the release history is a line of release commits,
so there the bisection walks releases. When a target sits on a release branch (vLLM tags vX.Y.Z on
releases/vX.Y), the bisection walks main between the merge-bases when main had the change where the
branch forked, else the branch's own commits; it starts after the last revert of the change, if any.
The release is the lowest final version tag carrying that commit, itself or as a cherry-pick on a
release branch (first_release, which also names the proving commit and branch), or None
("on <branch>, in no release yet"). What the probes say comes from the probes room's Witness, which validates
each on the pin: one that does not validate there is INVALID everywhere (never evidence).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vpatch import git, upstream
from vpatch.base import Reporter, VpatchError, silent
from vpatch.probes import ProbeFn, ProbeOutcome, Tally, Witness
from vpatch.status.landing import search_landing
from vpatch.upstream import (
    ReleaseProof,
    ancestry_order,
    change_history_grep,
    declare_commit_range,
    diff_patch_ids,
    first_release,
    nearest_ancestor,
    refs_digest,
    release_tags,
    save_commit_facts,
)
from vpatch.verdict import Kind, State, Verdict, judge_series

if TYPE_CHECKING:
    from vpatch.config import Config
    from vpatch.series import Patch


@dataclass(frozen=True)
class Target:
    ref: str
    commit: str


@dataclass(frozen=True)
class Landing:
    ref: str  # the first target where the patch is landed
    commit: str  # the first commit that has it (the target's own commit when nothing was bisected)
    release: str | None  # the first release tag containing `commit`; None: in no release yet
    bisected: bool  # False: no earlier not-landed target to bisect from, `commit` is only an upper bound
    checks: int = 0  # verdicts the bisection evaluated
    candidates: int = 0  # first-parent commits it searched
    since: str | None = None  # the target below, where the patch is not landed
    proof: ReleaseProof | None = None  # the commit (maybe a cherry-pick) on which branch that puts it in `release`


@dataclass(frozen=True)
class PatchStatus:
    number: int
    slug: str
    file: str
    subject: str
    results: tuple[Verdict, ...]  # one per Status.targets, same order
    landed_in: Landing | None

    def at(self, ref: str, targets: Sequence[Target]) -> Verdict:
        return self.results[[t.ref for t in targets].index(ref)]


@dataclass(frozen=True)
class Status:
    pin: Target
    targets: tuple[Target, ...]  # oldest first
    patches: tuple[PatchStatus, ...]
    branch: str
    history: bool  # upstream has per-commit history (git) rather than one commit per release
    probes_run: int = 0
    probes_cached: int = 0
    probe_errors: int = 0  # probe runs that could not decide (never counted as run)
    bisect_checks: int = 0

    def invalid_probes(self) -> list[str]:
        """Patches whose probe does not validate on the pin (it must fail there and pass with the series up to
        its patch): it cannot tell the bug from the fix, so it is no evidence anywhere."""
        return [file for file, _ in self.probe_problems() if self._invalid(file)]

    def probe_problems(self) -> list[tuple[str, str]]:
        """(patch file, why) for each probe that is invalid or could not decide on some target: a person must look."""
        out: dict[str, str] = {}
        for p in self.patches:
            for t, v in zip(self.targets, p.results):
                if v.probe is not None and v.probe.outcome is ProbeOutcome.ERROR and p.file not in out:
                    out[p.file] = v.probe.detail if v.probe.invalid else f"on {t.ref}: {v.probe.detail}"
        return list(out.items())

    def _invalid(self, file: str) -> bool:
        return any(v.probe is not None and v.probe.invalid for p in self.patches if p.file == file for v in p.results)


def newest_release(repo: Path) -> str | None:
    """The tag of the highest final release (vX.Y.Z, no pre-releases) upstream has."""
    versions = release_tags(git.tags(repo, "v*"))
    return versions[-1] if versions else None


def resolve_targets(repo: Path, config: Config, against: Sequence[str] = ()) -> tuple[Target, list[Target]]:
    """The pin and the targets to judge on: the pin plus `against`, or by default the pin, the newest
    release and (with a git upstream) the branch tip. Oldest first by ancestry; one column per commit."""
    refs = list(against)
    if not refs:
        newest = newest_release(repo)
        refs = [newest] if newest else []
        if config.upstream.source == "git":
            refs.append(config.upstream.branch)
    pin_commit = upstream.pin_commit(repo, config)
    commits = git.resolve_commits(repo, refs)
    unknown = [ref for ref in refs if commits[ref] is None]
    if unknown:
        raise VpatchError(f"unknown upstream ref {unknown[0]!r}: no such tag, branch or commit",
                          hint="vpatch fetch (or vpatch releases) to update upstream; release tags look like v0.30.0")
    pin = Target(config.pin.ref, pin_commit)
    seen: dict[str, Target] = {pin.commit: pin}
    for ref in refs:
        seen.setdefault(commits[ref] or "", Target(ref, commits[ref] or ""))
    # Oldest first by the commit graph, never by commit date (ancestry_order).
    branch = config.upstream.branch if config.upstream.source == "git" else None
    ordered = ancestry_order(repo, [(t.ref, t.commit) for t in seen.values()], branch=branch)
    return pin, [seen[commit] for _, commit in ordered]


def compute_status(
    repo: Path,
    patches: Sequence[Patch],
    *,
    pin: Target,
    targets: Sequence[Target],
    history: bool,
    branch: str = "main",
    evidence: Witness | None = None,
    landing: bool = True,
    history_evidence: bool = True,
    report: Reporter = silent,
) -> Status:
    """Judge every patch on every target, then find each landed patch's landing point (`report` hears the
    rename detection of files upstream moved). `evidence`: what the patches' probes say (None: no probes)."""
    before = evidence.tally if evidence is not None else Tally()
    if evidence is not None:
        evidence.name({t.commit: t.ref for t in [*targets, pin]})
    probe = evidence.asking(pin.commit, patches) if evidence is not None else None
    paths = sorted({path for patch in patches for path in patch.paths})
    if history and history_evidence:
        # every identity question below is about pin..<a target or one of its ancestors>: one walk answers all
        greps = sorted({g for patch in patches for g in change_history_grep(patch.upstream_pr)})
        declare_commit_range(repo, pin.commit, [t.commit for t in targets], path_sets=[p.paths for p in patches],
                            greps=greps)
        diff_patch_ids(repo, [p.diff for p in patches])
    # a partial mirror: what the verdicts below will read, in one fetch rather than one per blob
    upstream.prefetch_for_status(repo, pin.commit, [t.commit for t in targets], paths, history=history and history_evidence,
                        report=report)
    blobs = git.read_blobs_at(repo, [t.commit for t in targets], paths)  # one read for every target
    if evidence is not None:
        evidence.ahead(pin.commit, patches, [t.commit for t in targets])
    columns = [
        judge_series(repo, patches, t.commit, pin=pin.commit, history=history, probe=probe,
                     use_history_evidence=history_evidence, blobs=blobs[t.commit], branch=branch if history else None,
                     report=report)
        for t in targets
    ]
    rows: list[PatchStatus] = []
    checks = 0
    # read once for every landing: where main is, and the tags and branches a first release depends on
    refs = _Refs(git.resolve_commit(repo, branch) if history else None, refs_digest(repo)) if landing else None
    for i, patch in enumerate(patches):
        results = tuple(col[i] for col in columns)
        where = None
        if landing:
            assert refs is not None
            where = _landing(repo, patches, patch, targets, results, pin=pin.commit, history=history, probe=probe,
                             branch=branch, history_evidence=history_evidence, refs=refs)
            checks += where.checks if where else 0
        rows.append(PatchStatus(patch.number, patch.slug, patch.filename, patch.subject, results, where))
    save_commit_facts()
    counted = evidence.tally.since(before) if evidence is not None else Tally()
    return Status(pin, tuple(targets), tuple(rows), branch, history, probes_run=counted.ran,
                  probes_cached=counted.cached, probe_errors=counted.errors, bisect_checks=checks)


@dataclass(frozen=True)
class _Refs:
    main: str | None  # the commit upstream's main branch names (None: no per-commit history)
    state: str  # refs_digest


def _landing(
    repo: Path, patches: Sequence[Patch], patch: Patch, targets: Sequence[Target], results: Sequence[Verdict],
    *, pin: str, history: bool, probe: ProbeFn | None, branch: str, history_evidence: bool, refs: _Refs,
) -> Landing | None:
    first = next((j for j, v in enumerate(results) if v.state is State.LANDED), None)
    if first is None:
        return None
    top = targets[first]
    main = branch if history else None
    if first == 0:
        proof = first_release(repo, top.commit, branch=main, state=refs.state)
        return Landing(top.ref, top.commit, proof.release if proof else None, bisected=False, proof=proof)

    def landed(commit: str) -> bool:
        verdict = judge_series(repo, patches, commit, pin=pin, history=history, probe=probe,
                               only={patch.filename}, use_history_evidence=history_evidence, branch=main)[0]
        return verdict.state is State.LANDED

    # The baseline is the nearest earlier target the landed one descends from (the pin, for every target
    # it is an ancestor of); a target on another line only where none is.
    earlier = [t.commit for t in targets[:first]]
    below = nearest_ancestor(repo, earlier, top.commit) or targets[first - 1].commit
    since = next(t.ref for t in targets if t.commit == below)
    found = search_landing(repo, below=below, top=top.commit, main=refs.main, landed=landed,
                           floor=lambda line: _after_last_revert(line, results[first]))
    if found is None:
        proof = first_release(repo, top.commit, branch=main, state=refs.state)
        return Landing(top.ref, top.commit, proof.release if proof else None, bisected=False, proof=proof)
    proof = first_release(repo, found.commit, branch=main, state=refs.state)
    return Landing(top.ref, found.commit, proof.release if proof else None, bisected=True, checks=found.checks,
                   candidates=found.candidates, since=since, proof=proof)


def _after_last_revert(line: Sequence[str], verdict: Verdict) -> int:
    """Where the line's last revert of this change sits (+1), 0 when none is on the line."""

    named = {c for ev in verdict.evidence if ev.kind is Kind.REVERT for c in ev.commits}
    reverted = [c for c in line if c in named]
    return line.index(reverted[-1]) + 1 if reverted else 0
