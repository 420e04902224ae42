"""Verdicts for every patch x target, and where each landed patch landed: first commit (bisected) and release.

Library API (used by `vpatch status` and `vpatch update`):

    pin, targets = resolve_targets(repo, config, against=["v0.30.0"])   # [] -> the defaults
    report = compute(repo, series.patches, pin=pin, targets=targets, history=config.upstream.source == "git",
                     branch=config.upstream.branch, probe=probe_fn(repo, config))

`compute` returns a frozen `Status`: `targets` oldest first (the pin among them), one `PatchStatus` per
patch with a `Verdict` per target (`PatchStatus.at(ref)`), `landed_in` (a `Landing` or None), the
number of probes run and answered from the cache, and `exit_code()` for `--exit-code`.

Landing point: the first target (oldest first, by ancestry) where the patch is LANDED. When an earlier
target is not landed, the first-parent commits between the nearest such ancestor (the pin, for every target
it is an ancestor of) and the landed target are bisected with the full verdict (probe included)
as the test, so K commits cost about log2(K) checks; the release history is a line of release commits,
so there the bisection walks releases. When a target sits on a release branch (vLLM tags vX.Y.Z on
releases/vX.Y), the bisection walks main between the merge-bases when main had the change where the
branch forked, else the branch's own commits; it starts after the last revert of the change, if any.
The release is the lowest final version tag carrying that commit, itself or as a cherry-pick on a
release branch (lineage.first_release, which also names the proving commit and branch), or None
("on <branch>, in no release yet"). A probe that passes on the pin is INVALID everywhere (never evidence).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vpatch import git, upstream
from vpatch.base import ExitCode, Reporter, VpatchError, silent
from vpatch.probes import ProbeOutcome
from vpatch.probes import check as probe_check
from vpatch.probes import file as probe_file
from vpatch.probes import runner as probes
from vpatch.status import landing
from vpatch.status.landing import bisect_first as bisect_first  # noqa: PLC0414 - re-exported: status's landing search
from vpatch.upstream import commitcache, lineage, prefetch
from vpatch.verdict import Kind, ProbeCheck, ProbeFn, State, Verdict, decision, judge_series

if TYPE_CHECKING:
    from vpatch.config import Config
    from vpatch.probes import workspace as probe_runs
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
    proof: lineage.ReleaseProof | None = None  # the commit (maybe a cherry-pick) on which branch that puts it in `release`


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

    def exit_code(self) -> ExitCode:
        """What the decisions (decision.py) on the pin and every later target say: ATTENTION when any patch needs
        a person there (partial, conflict, disputed, landed on its own pin, its probe invalid or undecided),
        else LANDED when any would be dropped, else OK. Targets older than the pin say nothing about what to
        do next."""
        return decision.worst(d.exit_code for d in self.decisions())

    def decisions(self) -> list[decision.Decision]:
        """The decision for every patch on the pin and each later target, as an update to that target makes it."""
        start = self.targets.index(self.pin) if self.pin in self.targets else 0
        return [self.decision(p, v) for p in self.patches for v in p.results[start:]]

    def decision(self, patch: PatchStatus, verdict: Verdict) -> decision.Decision:
        """What an update to `verdict`'s target does with `patch` (decision.decide, the pin's verdict beside it)."""
        on_pin = patch.results[self.targets.index(self.pin)] if self.pin in self.targets else None
        return decision.decide(verdict, pin=on_pin, pin_ref=self.pin.ref)


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
    versions = lineage.release_tags(git.tags(repo, "v*"))
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
    # Oldest first by the commit graph, never by commit date (lineage.ancestry_order).
    branch = config.upstream.branch if config.upstream.source == "git" else None
    ordered = lineage.ancestry_order(repo, [(t.ref, t.commit) for t in seen.values()], branch=branch)
    return pin, [seen[commit] for _, commit in ordered]


def compute(
    repo: Path,
    patches: Sequence[Patch],
    *,
    pin: Target,
    targets: Sequence[Target],
    history: bool,
    branch: str = "main",
    probe: ProbeFn | None = None,
    landing: bool = True,
    history_evidence: bool = True,
    report: Reporter = silent,
) -> Status:
    """Judge every patch on every target, then find each landed patch's landing point (`report` hears the
    rename detection of files upstream moved)."""
    counter = _PinVettedProbe(_CountingProbe(probe), pin, repo, patches) if probe is not None else None
    paths = sorted({path for patch in patches for path in patch.paths})
    if history and history_evidence:
        # every identity question below is about pin..<a target or one of its ancestors>: one walk answers all
        greps = sorted({g for patch in patches for g in lineage.identity_grep(patch.upstream_pr)})
        commitcache.declare(repo, pin.commit, [t.commit for t in targets], path_sets=[p.paths for p in patches],
                            greps=greps)
        commitcache.diff_patch_ids(repo, [p.diff for p in patches])
    # a partial mirror: what the verdicts below will read, in one fetch rather than one per blob
    prefetch.for_status(repo, pin.commit, [t.commit for t in targets], paths, history=history and history_evidence,
                        report=report)
    blobs = git.read_blobs_at(repo, [t.commit for t in targets], paths)  # one read for every target
    if counter is not None:
        counter.ahead(targets)
    columns = [
        judge_series(repo, patches, t.commit, pin=pin.commit, history=history, probe=counter,
                     use_history_evidence=history_evidence, blobs=blobs[t.commit], branch=branch if history else None,
                     report=report)
        for t in targets
    ]
    rows: list[PatchStatus] = []
    checks = 0
    # read once for every landing: where main is, and the tags and branches a first release depends on
    refs = _Refs(git.resolve_commit(repo, branch) if history else None, lineage.refs_state(repo)) if landing else None
    for i, patch in enumerate(patches):
        results = tuple(col[i] for col in columns)
        where = None
        if landing:
            assert refs is not None
            where = _landing(repo, patches, patch, targets, results, pin=pin.commit, history=history, probe=counter,
                             branch=branch, history_evidence=history_evidence, refs=refs)
            checks += where.checks if where else 0
        rows.append(PatchStatus(patch.number, patch.slug, patch.filename, patch.subject, results, where))
    commitcache.save()
    return Status(pin, tuple(targets), tuple(rows), branch, history,
                  probes_run=counter.ran if counter else 0, probes_cached=counter.cached if counter else 0,
                  probe_errors=counter.inner.errors if counter else 0, bisect_checks=checks)


class _PinVettedProbe:
    """A probe is evidence only where it validates on the pin as `update` validates it: it fails on the pin and
    passes on the pin plus the series up to its patch (probes.validation's rule). One that passes on the pin is
    vacuous or landed on its own pin; one that still fails with the patch never passes; one that errors there,
    or checks a file that is on neither side, decides nothing. Such a probe is INVALID, on every commit."""

    def __init__(self, inner: _CountingProbe, pin: Target, repo: Path, patches: Sequence[Patch]) -> None:
        self.inner, self.pin, self.repo, self.patches = inner, pin, repo, patches
        self.on_pin: dict[str, tuple[ProbeCheck | None, ProbeCheck | None]] = {}

    @property
    def ran(self) -> int:
        return self.inner.ran

    @property
    def cached(self) -> int:
        return self.inner.cached

    def ahead(self, targets: Sequence[Target]) -> None:
        """Run, in parallel, the command probes that the calls below will ask for, and only those: each probe on
        the pin; where it fails there, on the pin plus the series up to its patch; where it passes there, on
        every other target. The calls then read the results in the verdicts' order."""

        runner = self.inner.inner
        if not isinstance(runner, ProbeRunner) or runner.session is None:
            return
        probed = [p for p in self.patches if p.probe_path is not None]
        at_pin = runner.ahead([(p, self.pin.commit) for p in probed])
        sides = []
        for patch, outcome in zip(probed, at_pin):
            if outcome is ProbeOutcome.FAIL:
                try:
                    sides.append((patch, probe_check.stacked_tree(self.repo, self.patches, self.pin.commit, patch)))
                except VpatchError:
                    pass  # _vet says why
        valid = {p.filename for (p, _), outcome in zip(sides, runner.ahead(sides)) if outcome is ProbeOutcome.PASS}
        runner.ahead([(p, t.commit) for t in targets if t.commit != self.pin.commit for p in probed
                      if p.filename in valid])

    def __call__(self, patch: Patch, commit: str) -> ProbeCheck | None:
        if patch.filename not in self.on_pin:
            self.on_pin[patch.filename] = self._vet(patch)
        at_pin, invalid = self.on_pin[patch.filename]
        if invalid is not None:
            return invalid
        return at_pin if commit == self.pin.commit else self.inner(patch, commit)

    def _vet(self, patch: Patch) -> tuple[ProbeCheck | None, ProbeCheck | None]:
        """The probe's answer on the pin, and the INVALID check to give instead when it does not validate."""

        at_pin = self.inner(patch, self.pin.commit)
        if at_pin is None:
            return None, None
        pin = f"the pin {self.pin.ref} ({self.pin.commit[:12]})"

        def invalid(why: str) -> tuple[ProbeCheck | None, ProbeCheck | None]:
            return at_pin, ProbeCheck(ProbeOutcome.ERROR, why, ran=False, invalid=True)

        why = ""
        try:
            patched: str | None = probe_check.stacked_tree(self.repo, self.patches, self.pin.commit, patch)
            probe = probe_file.Probe.load(patch.probe_path) if patch.probe_path is not None else None
        except VpatchError as exc:
            patched, probe, why = None, None, exc.message
        absent = probes.absent_files(self.repo, probe, (self.pin.commit, patched)) if probe and patched else []
        if absent:
            return invalid(f"files: {absent[0]}: no such file on {pin} nor with the patch; a typo in the path, or "
                           "the file moved: it reads nothing, fix the probe")
        if at_pin.outcome is ProbeOutcome.PASS:
            return invalid(f"it passes on {pin}, the tree the patch is meant to fix: vacuous, or landed on its own "
                           "pin; fix the probe")
        if at_pin.outcome is ProbeOutcome.ERROR:
            return invalid(f"it could not decide on {pin}: {at_pin.detail}")
        if patched is None:
            return invalid(f"it cannot be checked with its patch on {pin}: {why}")
        with_patch = self.inner(patch, patched)
        if with_patch is not None and with_patch.outcome is ProbeOutcome.FAIL:
            return invalid(f"it fails with the patch too, on {pin} plus the series up to it: it cannot tell the fix "
                           "from the bug; fix the probe (vpatch probe check " + f"{patch.number:04d})")
        if with_patch is not None and with_patch.outcome is ProbeOutcome.ERROR:
            return invalid(f"it could not decide with the patch, on {pin} plus the series up to it: {with_patch.detail}")
        return at_pin, None


class _CountingProbe:
    """Wraps the probe function to count runs and cache hits, for the report and the cache test."""

    def __init__(self, inner: ProbeFn) -> None:
        self.inner = inner
        self.ran = 0
        self.cached = 0
        self.errors = 0

    def __call__(self, patch: Patch, commit: str) -> ProbeCheck | None:
        check = self.inner(patch, commit)
        if check is not None:
            if check.outcome is ProbeOutcome.ERROR:
                self.errors += 1  # could not decide: neither a run that answered nor a cache hit
            elif check.ran:
                self.ran += 1
            else:
                self.cached += 1
        return check


@dataclass(frozen=True)
class _Refs:
    main: str | None  # the commit upstream's main branch names (None: no per-commit history)
    state: str  # lineage.refs_state


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
        proof = lineage.first_release(repo, top.commit, branch=main, state=refs.state)
        return Landing(top.ref, top.commit, proof.release if proof else None, bisected=False, proof=proof)

    def landed(commit: str) -> bool:
        verdict = judge_series(repo, patches, commit, pin=pin, history=history, probe=probe,
                               only={patch.filename}, use_history_evidence=history_evidence, branch=main)[0]
        return verdict.state is State.LANDED

    # The baseline is the nearest earlier target the landed one descends from (the pin, for every target
    # it is an ancestor of); a target on another line only where none is.
    earlier = [t.commit for t in targets[:first]]
    below = lineage.nearest_ancestor(repo, earlier, top.commit) or targets[first - 1].commit
    since = next(t.ref for t in targets if t.commit == below)
    found = landing.search(repo, below=below, top=top.commit, main=refs.main, landed=landed,
                           floor=lambda line: _after_last_revert(line, results[first]))
    if found is None:
        proof = lineage.first_release(repo, top.commit, branch=main, state=refs.state)
        return Landing(top.ref, top.commit, proof.release if proof else None, bisected=False, proof=proof)
    proof = lineage.first_release(repo, found.commit, branch=main, state=refs.state)
    return Landing(top.ref, found.commit, proof.release if proof else None, bisected=True, checks=found.checks,
                   candidates=found.candidates, since=since, proof=proof)


def _after_last_revert(line: Sequence[str], verdict: Verdict) -> int:
    """Where the line's last revert of this change sits (+1), 0 when none is on the line."""

    story = next((ev.detail for ev in verdict.evidence if ev.kind is Kind.REVERT), "")
    named = set(re.findall(r"reverted in ([0-9a-f]{12})", story))
    reverted = [c for c in line if c[:12] in named] if named else []
    return line.index(reverted[-1]) + 1 if reverted else 0


def probe_fn(repo: Path, config: Config | None = None, *, cache: Path | None = None,
             report: Reporter | None = None, names: Mapping[str, str] | None = None,
             session: probe_runs.Session | None = None) -> ProbeRunner:
    """The probe runner the verdict wants: (patch, commit) -> its probe's answer on that unpatched commit.

    Results come from probes.run_probe, cached by (probe content, tree id), so a second status runs no
    probe. A probe that cannot be loaded or run is an ERROR, which the verdict counts neither way.
    `report` hears each probe that runs, named by patch and target (`names`: commit -> ref). With a
    `session`, trees are extracted once and `compute` runs the command probes ahead, in parallel."""
    return ProbeRunner(repo, config, cache, report or silent, names or {}, session)


class ProbeRunner:
    """See probe_fn."""

    def __init__(self, repo: Path, config: Config | None, cache: Path | None, report: Reporter,
                 names: Mapping[str, str], session: probe_runs.Session | None) -> None:
        self.repo, self.config, self.cache, self.report, self.names = repo, config, cache, report, names
        self.session = session
        self._loaded: dict[Path, probe_file.Probe] = {}
        self._base: list[str | None] = []  # the pin, where the probes' paths are named (moves are followed from there)

    def _moves_from(self) -> str | None:

        if not self._base:
            self._base.append(probes.moves_base(self.repo, self.config))
        return self._base[0]

    def _probe(self, path: Path) -> probe_file.Probe:
        if path not in self._loaded:
            self._loaded[path] = probe_file.Probe.load(path)
        return self._loaded[path]

    def _label(self, patch: Patch, commit: str) -> str:
        return f"{patch.name} on {self.names.get(commit, commit[:12])}"

    def __call__(self, patch: Patch, commit: str) -> ProbeCheck | None:
        if patch.probe_path is None:
            return None

        try:
            result = probes.run_probe(self.repo, self._probe(patch.probe_path), commit, cache=self.cache,
                                      label=self._label(patch, commit), report=self.report,
                                      moves_from=self._moves_from(), session=self.session)
        except VpatchError as exc:
            return ProbeCheck(ProbeOutcome.ERROR, _last_lines(exc.message))
        return ProbeCheck(ProbeOutcome(result.outcome.value), _last_lines(result.detail), ran=not result.cached)

    def ahead(self, pairs: Sequence[tuple[Patch, str]]) -> list[ProbeOutcome | None]:
        """Run the command probes of (patch, commit) `pairs` at once, up to the session's jobs, for the calls
        that ask for them later; their outcomes (None: not run ahead, it runs when asked)."""

        if self.session is None:
            return [None] * len(pairs)
        requests: list[probes.Request | None] = []
        for patch, commit in pairs:
            try:
                probe = self._probe(patch.probe_path) if patch.probe_path is not None else None
            except VpatchError:
                probe = None  # the call says why
            requests.append(None if probe is None else
                            probes.Request(probe, commit, self._label(patch, commit), self._moves_from()))
        try:
            found = probes.run_ahead(self.repo, [r for r in requests if r is not None], self.session,
                                     report=self.report)
        except VpatchError:
            return [None] * len(pairs)  # e.g. a tree that cannot be read: the call in order says so
        results = iter(found)
        return [None if r is None else (lambda got: None if got is None else got.outcome)(next(results))
                for r in requests]


def _last_lines(text: str, lines: int = 2, chars: int = 240) -> str:
    """The end of a probe's output: where a probe prints its conclusion."""
    tail = " | ".join(line.strip() for line in text.strip().splitlines()[-lines:] if line.strip())
    return tail if len(tail) <= chars else "..." + tail[-chars:]
