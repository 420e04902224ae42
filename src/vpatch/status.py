"""Verdicts for every patch x target, and where each landed patch landed: first commit (bisected) and release.

Library API (used by `vpatch status` and `vpatch update`):

    pin, targets = resolve_targets(repo, config, against=["v0.30.0"])   # [] -> the defaults
    report = compute(repo, series.patches, pin=pin, targets=targets, history=config.upstream.source == "git",
                     branch=config.upstream.branch, probe=probe_fn(repo, config))

`compute` returns a frozen `Status`: `targets` oldest first (the pin among them), one `PatchStatus` per
patch with a `Verdict` per target (`PatchStatus.at(ref)`), `landed_in` (a `Landing` or None), the
number of probes run and answered from the cache, and `exit_code()` for `--exit-code`.

Landing point: the first target (oldest first) where the patch is LANDED. When an earlier target is not
landed, the first-parent commits between the two are bisected with the full verdict (probe included)
as the test, so K commits cost about log2(K) checks; the release history is a line of release commits,
so there the bisection walks releases. The release is the lowest final version tag containing that
commit, or None ("on <branch>, in no release yet").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vpatch import git
from vpatch.errors import ExitCode, VpatchError
from vpatch.verdict import (
    ProbeCheck,
    ProbeFn,
    ProbeOutcome,
    State,
    Verdict,
    judge_series,
)

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
    bisect_checks: int = 0

    def exit_code(self) -> ExitCode:
        """ATTENTION when any patch is partial or conflicts on the pin or a later target, else LANDED when
        any landed there, else OK. Targets older than the pin say nothing about what to do next."""
        start = self.targets.index(self.pin) if self.pin in self.targets else 0
        states = {v.state for p in self.patches for v in p.results[start:]}
        if states & {State.PARTIAL, State.CONFLICT}:
            return ExitCode.ATTENTION
        if State.LANDED in states:
            return ExitCode.LANDED
        return ExitCode.OK


def newest_release(repo: Path) -> str | None:
    """The tag of the highest final release (vX.Y.Z, no pre-releases) upstream has."""
    versions = _release_tags(git.tags(repo, "v*"))
    return versions[-1] if versions else None


def resolve_targets(repo: Path, config: Config, against: Sequence[str] = ()) -> tuple[Target, list[Target]]:
    """The pin and the targets to judge on: the pin plus `against`, or by default the pin, the newest
    release and (with a git upstream) the branch tip. Oldest first; one column per commit."""
    refs = list(against)
    if not refs:
        newest = newest_release(repo)
        refs = [newest] if newest else []
        if config.upstream.source == "git":
            refs.append(config.upstream.branch)
    commits = git.resolve_commits(repo, [config.pin.ref, *refs])
    pin_commit = config.pin.commit or commits[config.pin.ref]
    if pin_commit is None:
        raise VpatchError(f"the pin {config.pin.ref!r} names nothing upstream",
                          hint="vpatch fetch (or vpatch releases) to update upstream, or fix pin.ref in vpatch.yaml")
    unknown = [ref for ref in refs if commits[ref] is None]
    if unknown:
        raise VpatchError(f"unknown upstream ref {unknown[0]!r}: no such tag, branch or commit",
                          hint="vpatch fetch (or vpatch releases) to update upstream; release tags look like v0.30.0")
    pin = Target(config.pin.ref, pin_commit)
    seen: dict[str, Target] = {pin.commit: pin}
    for ref in refs:
        seen.setdefault(commits[ref] or "", Target(ref, commits[ref] or ""))
    # Oldest first by commit time; where times tie (scripted histories), ancestry decides: an ancestor
    # reaches fewer commits than its descendants.
    times = git.commit_times(repo, list(seen))
    tied = {c for c in seen if list(times.values()).count(times.get(c, 0)) > 1}
    depth = {c: git.reachable_count(repo, c) if c in tied else 0 for c in seen}
    ordered = sorted(seen.values(), key=lambda t: (times.get(t.commit, 0), depth[t.commit], t is not pin))
    return pin, ordered


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
) -> Status:
    """Judge every patch on every target, then find each landed patch's landing point."""
    counter = _CountingProbe(probe) if probe is not None else None
    paths = sorted({path for patch in patches for path in patch.paths})
    blobs = git.read_blobs_at(repo, [t.commit for t in targets], paths)  # one read for every target
    columns = [
        judge_series(repo, patches, t.commit, pin=pin.commit, history=history, probe=counter,
                     use_history_evidence=history_evidence, blobs=blobs[t.commit])
        for t in targets
    ]
    rows: list[PatchStatus] = []
    checks = 0
    for i, patch in enumerate(patches):
        results = tuple(col[i] for col in columns)
        where = None
        if landing:
            where = _landing(repo, patches, patch, targets, results, pin=pin.commit, history=history, probe=counter,
                             branch=branch, history_evidence=history_evidence)
            checks += where.checks if where else 0
        rows.append(PatchStatus(patch.number, patch.slug, patch.filename, patch.subject, results, where))
    return Status(pin, tuple(targets), tuple(rows), branch, history,
                  probes_run=counter.ran if counter else 0, probes_cached=counter.cached if counter else 0,
                  bisect_checks=checks)


class _CountingProbe:
    """Wraps the probe function to count runs and cache hits, for the report and the cache test."""

    def __init__(self, inner: ProbeFn) -> None:
        self.inner = inner
        self.ran = 0
        self.cached = 0

    def __call__(self, patch: Patch, commit: str) -> ProbeCheck | None:
        check = self.inner(patch, commit)
        if check is not None:
            if check.ran:
                self.ran += 1
            else:
                self.cached += 1
        return check


def _landing(
    repo: Path, patches: Sequence[Patch], patch: Patch, targets: Sequence[Target], results: Sequence[Verdict],
    *, pin: str, history: bool, probe: ProbeFn | None, branch: str, history_evidence: bool,
) -> Landing | None:
    first = next((j for j, v in enumerate(results) if v.state is State.LANDED), None)
    if first is None:
        return None
    top = targets[first]
    if first == 0:
        return Landing(top.ref, top.commit, first_release(repo, top.commit), bisected=False)
    below = targets[first - 1].commit
    base = below if git.is_ancestor(repo, below, top.commit) else git.merge_base(repo, below, top.commit)
    if base is None:
        return Landing(top.ref, top.commit, first_release(repo, top.commit), bisected=False)
    line = git.first_parent_commits(repo, base, top.commit)

    def landed(commit: str) -> bool:
        verdict = judge_series(repo, patches, commit, pin=pin, history=history, probe=probe,
                               only={patch.filename}, use_history_evidence=history_evidence)[0]
        return verdict.state is State.LANDED

    found, checks = bisect_first(line, landed)
    return Landing(top.ref, found, first_release(repo, found), bisected=True, checks=checks, candidates=len(line),
                   since=targets[first - 1].ref)


def bisect_first(line: Sequence[str], landed: Callable[[str], bool]) -> tuple[str, int]:
    """The first commit of `line` (oldest first, whose last commit is known landed) where `landed` holds,
    assuming once landed it stays landed; returns it and how many checks it took."""
    lo, hi, checks = 0, len(line) - 1, 0
    while lo < hi:
        mid = (lo + hi) // 2
        checks += 1
        if landed(line[mid]):
            hi = mid
        else:
            lo = mid + 1
    return line[hi], checks


def first_release(repo: Path, commit: str) -> str | None:
    """The lowest final release tag that contains `commit`."""
    tags = _release_tags(git.tags_containing(repo, commit))
    return tags[0] if tags else None


def _release_tags(tags: Sequence[str]) -> list[str]:
    """Final release tags (vX.Y.Z...), sorted by version; pre-releases and other tags left out."""
    from packaging.version import InvalidVersion, Version

    parsed = []
    for tag in tags:
        try:
            version = Version(tag[1:] if tag[:1] in "vV" else tag)
        except InvalidVersion:
            continue
        if not (version.is_prerelease or version.is_devrelease):
            parsed.append((version, tag))
    return [tag for _, tag in sorted(parsed)]



def probe_fn(repo: Path, config: Config | None = None, *, cache: Path | None = None) -> ProbeFn:
    """The probe runner the verdict wants: (patch, commit) -> its probe's answer on that unpatched commit.

    Results come from probes.run_probe, cached by (probe content, tree id), so a second status runs no
    probe. A probe that cannot be loaded or run is an ERROR, which the verdict counts neither way."""
    loaded: dict[Path, object] = {}

    def run(patch: Patch, commit: str) -> ProbeCheck | None:
        if patch.probe_path is None:
            return None
        from vpatch import probes

        try:
            if patch.probe_path not in loaded:
                loaded[patch.probe_path] = probes.Probe.load(patch.probe_path)
            probe = loaded[patch.probe_path]
            assert isinstance(probe, probes.Probe)
            result = probes.run_probe(repo, probe, commit, cache=cache)
        except VpatchError as exc:
            return ProbeCheck(ProbeOutcome.ERROR, _last_lines(exc.message))
        return ProbeCheck(ProbeOutcome(result.outcome.value), _last_lines(result.detail), ran=not result.cached)

    return run


def _last_lines(text: str, lines: int = 2, chars: int = 240) -> str:
    """The end of a probe's output: where a probe prints its conclusion."""
    tail = " | ".join(line.strip() for line in text.strip().splitlines()[-lines:] if line.strip())
    return tail if len(tail) <= chars else "..." + tail[-chars:]
