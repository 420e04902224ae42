"""One patch on one upstream commit: landed / needed / partial / conflict, and the evidence that decided it.

Library API (used by `vpatch status` and `vpatch update`):

    verdicts = judge_series(repo, patches, commit, pin=pin_commit, history=True,
                            probe=witness.asking(pin_commit, patches))   # witness: a probes.Witness

returns one frozen `Verdict` per patch, in series order. `Verdict.state` is a `State`;
`Verdict.evidence` lists every fact found, strongest first, each an `Evidence(kind, says, detail)`;
`Verdict.decided_by` is the fact that set the state. Only `State.LANDED` means "safe to drop".

Rules, in order:
- A probe that PASSes on the unpatched commit decides LANDED, even when the diff still applies (the
  probe tests behaviour; upstream may have fixed it differently). A probe that FAILs overrides any
  textual sign of landing. A probe ERROR counts as neither: it is shown and the textual evidence decides.
- Without a deciding probe: the whole diff reverse-applies, an upstream commit with the same patch-id
  is in pin..commit, or the patch's Upstream-PR "(#N)" is in a subject in pin..commit -> LANDED. A
  landing reverted later in pin..commit (and not re-landed) counts as none (change_history), and the
  revert is evidence of its own.
- Identity evidence (patch-id, PR) says landed while the diff still applies cleanly (or with offsets)
  and does not reverse-apply, and no probe decides -> DISPUTED: a person must look.
- Reverse-apply counts only where the forward application fails: git finds a post-image anywhere in the
  file, also in a copy far from the hunk's place. Where both directions apply, the image nearer the hunk's
  line numbers is taken as its place: the pre-image (or a tie) -> the hunk is needed; the post-image ->
  DISPUTED when no probe decides (see textual.read).
- Otherwise per hunk: some hunks already upstream (they reverse-apply) while others are not -> PARTIAL,
  naming both sets (never LANDED: a patch is never dropped because part of it landed).
- Otherwise it forward-applies (cleanly, with offsets, or only 3-way) -> NEEDED, else CONFLICT.

Moves (moves.py): a path the patch reads that is a file at the pin and missing on the commit is looked up
with git's rename detection from the pin. A move is followed: the patch is judged at the new path by every
rule above (re-targeted, as `git am -3` would apply it), with a `moved` evidence item naming old -> new,
the similarity and the commit that moved it. A path deleted with no successor, or split into near-equal
candidates, is not guessed: a `moved` item says so, and unless a probe or identity evidence says landed
the patch is CONFLICT, decided by that item (a person must look).

Stack semantics: a later patch is judged on the commit plus the earlier patches that are NEEDED there
and touch the same files (the tree `vpatch apply`/`update` would build), so a patch written on top of
another is not called a conflict. Probes always run on the unpatched commit: the question they answer
is "does upstream have this behaviour", and that keeps their cache key the upstream tree.

Textual checks never check out a tree; textual.py reads the diff on the touched blobs in memory, with
`git apply --cached` on a temporary index for what that model does not cover.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path

from vpatch import git
from vpatch.base import Reporter, silent
from vpatch.probes import ProbeCheck, ProbeFn, ProbeOutcome
from vpatch.series import FileDiff, Hunk, Patch
from vpatch.upstream import (
    ChangeHistory,
    HistoryEvent,
    HunkMove,
    Move,
    cached_is_ancestor,
    change_history,
    diff_patch_id,
    follow_file_moves,
    hunk_placements,
    hunks_to_find,
    missing_paths,
    moves_read_by,
    relocate_hunks,
    relocated_patch,
    retarget_paths,
)
from vpatch.verdict.textual import Applies as Applies  # noqa: PLC0414 - re-exported: a verdict says how the diff applies
from vpatch.verdict.textual import Text, Tree, read, with_three_way
from vpatch.verdict.textual import hunk_name as hunk_name  # noqa: PLC0414 - re-exported for narrow.py


class State(str, Enum):
    LANDED = "landed"  # upstream has the change: the patch can be dropped
    NEEDED = "needed"  # applies, and nothing says upstream has it
    PARTIAL = "partial"  # some hunks are upstream, others are not: a person must refresh it
    CONFLICT = "conflict"  # does not apply and has not landed: a person must rebase it
    # the evidence contradicts itself (identity vs content, or both images of a hunk in the file) and no
    # probe decides: a person must look
    DISPUTED = "disputed"


class Kind(str, Enum):
    PROBE = "probe"
    REVERSE = "reverse-apply"
    PATCH_ID = "patch-id"
    UPSTREAM_PR = "upstream-pr"
    FORWARD = "forward-apply"
    HUNKS = "hunks"
    REVERT = "revert"  # a landing was reverted (and maybe re-landed) on the way to the commit
    MOVED = "moved"  # a touched file moved (followed), or was deleted or split (not guessed) since the pin
    DISAGREEMENT = "disagreement"  # identity and content evidence contradict each other


class Says(str, Enum):
    """What one piece of evidence says about whether upstream has the change."""

    LANDED = "landed"
    NOT_LANDED = "not-landed"
    UNAVAILABLE = "unavailable"  # could not be checked here (probe error, no commit history, no trailer)
    NEUTRAL = "neutral"  # bears on how the rest was read (a move followed), not on whether it landed


@dataclass(frozen=True)
class Evidence:
    kind: Kind
    says: Says
    detail: str  # in words, for people: nothing decides by reading it back
    commits: tuple[str, ...] = ()  # REVERT: the upstream commits that reverted the change (full ids)
    path: str = ""  # MOVED: the patch's file (its path at the pin) the evidence is about

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.detail}"


@dataclass(frozen=True)
class Verdict:
    patch: str  # file name, e.g. "0002-mamba-null-gap-free.patch"
    commit: str
    state: State
    evidence: tuple[Evidence, ...]
    applies: Applies
    landed_hunks: tuple[str, ...] = ()  # "path hunk N (@@ -a,b +c,d @@)" already upstream
    needed_hunks: tuple[str, ...] = ()  # hunks that still apply
    conflict_hunks: tuple[str, ...] = ()  # hunks that neither apply nor are upstream
    probe: ProbeCheck | None = field(default=None, compare=False)
    moved: tuple[Move, ...] = ()  # where the files it reads went since the pin (followed or not)
    # where the code of hunks that are not where git puts their file went (hunkmoves.py): re-targeted or not
    hunk_moves: tuple[HunkMove, ...] = ()

    @property
    def decided_by(self) -> Evidence | None:
        """The evidence that set the state."""
        if self.state is State.LANDED:
            return next((ev for ev in self.evidence if ev.says is Says.LANDED), None)
        if self.state is State.NEEDED:
            probe_fail = [ev for ev in self.evidence if ev.kind is Kind.PROBE and ev.says is Says.NOT_LANDED]
            return probe_fail[0] if probe_fail else self._of(Kind.FORWARD)
        if self.state is State.PARTIAL:
            return self._of(Kind.HUNKS)
        if self.state is State.DISPUTED:
            return self._of(Kind.DISAGREEMENT)
        lost = next((ev for ev in self.evidence if ev.kind is Kind.MOVED and ev.says is Says.UNAVAILABLE), None)
        return lost or self._of(Kind.HUNKS) or self._of(Kind.FORWARD)

    def _of(self, kind: Kind) -> Evidence | None:
        return next((ev for ev in self.evidence if ev.kind is kind), None)


FOLLOWED_CODE = "each of its hunks followed its code to one clear place"  # a deleted or split file's hunks all moved
_NO_HISTORY = "not available, the release history has no per-commit diffs"


def judge(repo: Path, patch: Patch, commit: str, *, pin: str, history: bool, probe: ProbeFn | None = None) -> Verdict:
    """The verdict for one patch alone on `commit` (no earlier patches stacked under it)."""
    return judge_series(repo, [patch], commit, pin=pin, history=history, probe=probe)[0]


def judge_series(
    repo: Path,
    patches: Sequence[Patch],
    commit: str,
    *,
    pin: str,
    history: bool,
    probe: ProbeFn | None = None,
    only: Collection[str] | None = None,
    use_history_evidence: bool = True,
    blobs: Mapping[str, bytes | None] | None = None,
    branch: str | None = None,
    report: Reporter = silent,
) -> tuple[Verdict, ...]:
    """Verdicts for `patches` on `commit`, in order, with stack semantics (see the module docstring).

    `history`: upstream has per-commit history (a git mirror), so patch-id and PR evidence can be read
    from pin..commit; False for the release history. `only`: judge just these patch files (the earlier
    patches they stack on are still evaluated, textually). `use_history_evidence=False` skips the
    patch-id and PR look-ups altogether (the fast textual mode). `blobs`: the touched files of `commit`
    already read (path -> content, None: absent), e.g. by one `git.read_blobs_at` for many commits.
    `branch`: a git upstream's main branch, to name the first release of a move (follow_file_moves); `report` hears
    its rename detection.
    """
    wanted = _stack_closure(patches, only)
    if blobs is None:
        # one read of the judged files for the moves and the tree below, not one each (a bisection step, which
        # has no column's read to reuse, is mostly reads)
        blobs = git.read_blobs(repo, commit, sorted({path for p in patches if p.filename in wanted for path in p.paths}))
    found = _moves(repo, patches, wanted, commit, pin=pin, blobs=blobs, branch=branch, describe=only is None,
                   report=report)
    originals = {p.filename: p for p in patches}
    patches = [retarget_paths(p, found) for p in patches]
    paths = sorted({p for patch in patches if patch.filename in wanted for p in patch.paths})
    verdicts: list[Verdict] = []
    with Tree(repo, commit, patches, paths, blobs) as tree:
        for i, patch in enumerate(patches):
            if patch.filename not in wanted:
                continue
            is_target = only is None or patch.filename in only
            text = read(tree, patch)
            original = originals[patch.filename]
            hunk_found: dict[tuple[str, int], HunkMove] = {}
            placements: dict[tuple[str, int], tuple[str, int, str]] = {}
            if text.forward is Applies.NO and not text.reverse and text.conflict:
                # hunks that are not where git puts their file: look where their code went (hunkmoves.py)
                hunk_found = relocate_hunks(repo, pin, commit, hunks_to_find(original, patch, _named(text.conflict), found),
                                                describe=only is None, branch=branch, report=report)
                placements = hunk_placements(hunk_found)
                if placements:
                    patch = patches[i] = relocated_patch(original, patch, placements)
                    tree.add_paths(patch.paths)
                    text = read(tree, patch)
            # asked once the code is found: a `files` probe follows it where it went (probes/follow.py)
            check = probe(original, commit, {key: place[0] for key, place in placements.items()}) \
                if (probe is not None and is_target) else None
            # identity is upstream's commits against the patch as written (its patch-id names the pin's paths),
            # and against the patch at the new places when it was re-targeted
            hist = [] if not is_target else _history_evidence(
                repo, original, commit, pin=pin, history=history and use_history_evidence,
                retargeted=patch if patch.diff != original.diff else None)
            if _three_way_decides(text, check, hist):
                text = with_three_way(tree, patch, text)
            evidence = _evidence(patch, text=text, probe=check, history=hist) + _move_evidence(
                original, found, hunk_found)
            verdict = _decide(patch, commit, text, evidence, check)
            if found or hunk_found:
                verdict = replace(verdict, moved=tuple(moves_read_by(original, found)),
                                  hunk_moves=tuple(m for m in hunk_found.values() if m.candidates))
            if is_target:
                verdicts.append(verdict)
            later_overlap = any(set(p.paths) & set(patch.paths) for p in patches[i + 1:] if p.filename in wanted)
            if verdict.state is State.NEEDED and later_overlap:
                tree.apply(patch, three_way=text.forward is Applies.THREE_WAY)
    return tuple(verdicts)


def _moves(repo: Path, patches: Sequence[Patch], wanted: Collection[str], commit: str, *, pin: str,
           blobs: Mapping[str, bytes | None] | None, branch: str | None, describe: bool,
           report: Reporter) -> dict[str, Move]:
    """Where the paths the judged patches read went since the pin; rename detection runs only when one of
    them is missing on `commit`."""
    reads = sorted({fd.old_path for p in patches if p.filename in wanted for fd in p.files if fd.old_path})
    gone = missing_paths(repo, pin, commit, reads, blobs)
    # the commit that moved a file is named in a column's evidence; a bisection step (`only`) needs just the move
    return follow_file_moves(repo, pin, commit, gone, branch=branch, describe=describe, report=report) if gone else {}


def _move_evidence(patch: Patch, found: Mapping[str, Move],
                   hunks: Mapping[tuple[str, int], HunkMove] | None = None) -> tuple[Evidence, ...]:
    hunks = hunks or {}
    out = []
    for move in moves_read_by(patch, found):
        if move.followed:
            out.append(Evidence(Kind.MOVED, Says.NEUTRAL, f"{move}: judged at {move.new}", path=move.old))
            continue
        fd = next(fd for fd in patch.files if fd.old_path == move.old)
        if fd.hunks and all(hunks.get((move.old, n)) is not None and hunks[(move.old, n)].followed
                            for n in range(1, len(fd.hunks) + 1)):
            # every hunk of the file followed its code to a clear place: the file's fate no longer blocks
            out.append(Evidence(Kind.MOVED, Says.NEUTRAL, f"{move.fate_words()}; {FOLLOWED_CODE} (below)",
                                path=move.old))
        else:
            out.append(Evidence(Kind.MOVED, Says.UNAVAILABLE, str(move), path=move.old))
    for hunk in hunks.values():
        if hunk.followed:
            out.append(Evidence(Kind.MOVED, Says.NEUTRAL, f"{hunk}: judged there"))
        elif hunk.candidates:
            out.append(Evidence(Kind.MOVED, Says.UNAVAILABLE, str(hunk)))
    return tuple(out)


def _named(names: Collection[str]) -> Callable[[FileDiff, int, Hunk], bool]:
    """Whether a hunk is one of `names` (hunk_name's words)."""
    wanted = set(names)
    return lambda fd, n, hunk: hunk_name(fd, n, hunk) in wanted


def _stack_closure(patches: Sequence[Patch], only: Collection[str] | None) -> set[str]:
    """The patches to evaluate: `only` plus every earlier patch that shares files with one of them."""
    if only is None:
        return {p.filename for p in patches}
    wanted: set[str] = set()
    paths: set[str] = set()
    for patch in reversed(patches):
        if patch.filename in only or paths & set(patch.paths):
            wanted.add(patch.filename)
            paths |= set(patch.paths)
    return wanted


def _three_way_decides(text: Text, probe: ProbeCheck | None, history: Sequence[Evidence]) -> bool:
    """Whether needed-vs-conflict hangs on a 3-way merge (a git process): not when the patch does not
    reach that question - its probe passes, other evidence says landed, or it is partial."""
    if text.forward is not Applies.NO or text.reverse:
        return False
    if probe is not None and probe.outcome is ProbeOutcome.PASS:
        return False
    if (probe is None or probe.outcome is not ProbeOutcome.FAIL) and any(ev.says is Says.LANDED for ev in history):
        return False
    return not (text.landed and (text.needed or text.conflict))


def _evidence(patch: Patch, *, text: Text, probe: ProbeCheck | None, history: Sequence[Evidence]) -> tuple[Evidence, ...]:
    out: list[Evidence] = []
    if probe is not None:
        probe_name = patch.trailer("Probe") or "probe"
        # a files probe run where its patch's code went says where it looked (probes/follow.py)
        followed = "".join(f"; probe followed {m}" for m in probe.followed)
        if probe.outcome is ProbeOutcome.PASS:
            out.append(Evidence(Kind.PROBE, Says.LANDED,
                                f"{probe_name} passes on the unpatched tree" + _tail(probe.detail) + followed))
        elif probe.outcome is ProbeOutcome.FAIL:
            out.append(Evidence(Kind.PROBE, Says.NOT_LANDED,
                                f"{probe_name} fails on the unpatched tree" + _tail(probe.detail) + followed))
        elif probe.invalid:
            out.append(Evidence(Kind.PROBE, Says.UNAVAILABLE,
                                f"{probe_name} is INVALID (counted neither way): {probe.detail}"))
        elif probe.unfollowed:
            out.append(Evidence(Kind.PROBE, Says.UNAVAILABLE,
                                f"{probe_name} was not followed where its patch's code went (counted neither way): "
                                f"{probe.detail}"))
        else:
            out.append(Evidence(Kind.PROBE, Says.UNAVAILABLE,
                                f"{probe_name} could not run (error, counted neither way)" + _tail(probe.detail)
                                + followed))
    if text.reverse:
        out.append(Evidence(Kind.REVERSE, Says.LANDED, "the whole diff reverse-applies: the change is there verbatim"))
    elif text.elsewhere:
        out.append(Evidence(Kind.REVERSE, Says.NOT_LANDED,
                            "the post-image is only a copy away from where the hunks belong, the pre-image is "
                            f"nearer ({text.elsewhere}): not a landing"))
    else:
        out.append(Evidence(Kind.REVERSE, Says.NOT_LANDED, "the diff does not reverse-apply"))
    out += history
    if text.forward is Applies.CLEAN:
        out.append(Evidence(Kind.FORWARD, Says.NOT_LANDED, "the diff applies cleanly"))
    elif text.forward is Applies.OFFSETS:
        out.append(Evidence(Kind.FORWARD, Says.NOT_LANDED, f"the diff applies with offsets: {text.offsets}"))
    elif text.forward is Applies.THREE_WAY:
        out.append(Evidence(Kind.FORWARD, Says.NOT_LANDED, "the diff applies only with a (clean) 3-way merge"))
    else:
        out.append(Evidence(Kind.FORWARD, Says.UNAVAILABLE, "the diff does not apply"
                            + (", not even 3-way" if text.three_way_tried else "")))
    if text.landed or text.conflict or (text.ambiguous and text.forward is Applies.NO):
        parts = []
        if text.landed:
            parts.append("upstream already has " + "; ".join(text.landed))
        if text.needed:
            parts.append("still needed: " + "; ".join(text.needed))
        if text.conflict:
            parts.append("do not apply: " + "; ".join(text.conflict))
        if text.ambiguous:
            parts.append("both pre- and post-image in the file: " + "; ".join(text.ambiguous))
        says = Says.NOT_LANDED if (text.needed or text.conflict or text.ambiguous) else Says.LANDED
        out.append(Evidence(Kind.HUNKS, says, ". ".join(parts)))
    return tuple(out)


def _history_evidence(repo: Path, patch: Patch, commit: str, *, pin: str, history: bool,
                      retargeted: Patch | None = None) -> list[Evidence]:
    """Patch-id and PR evidence; for a patch re-targeted to where upstream moved its code, an upstream commit with
    the re-targeted patch's patch-id counts as one with the patch's own."""
    found = _identity_of(repo, patch, commit, pin=pin, history=history)
    if retargeted is None or not history or any(ev.says is Says.LANDED for ev in found):
        return found
    moved = _identity_of(repo, retargeted, commit, pin=pin, history=history)
    if any(ev.kind is Kind.PATCH_ID and ev.says is Says.LANDED for ev in moved):
        return [replace(ev, detail=ev.detail + " (the patch at the places its code moved to)")
                if ev.kind is Kind.PATCH_ID else ev for ev in moved]
    return found


def _identity_of(repo: Path, patch: Patch, commit: str, *, pin: str, history: bool) -> list[Evidence]:
    if not history:
        pr = f" (Upstream-PR #{patch.upstream_pr})" if patch.upstream_pr else ""
        return [Evidence(Kind.PATCH_ID, Says.UNAVAILABLE, _NO_HISTORY),
                Evidence(Kind.UPSTREAM_PR, Says.UNAVAILABLE, _NO_HISTORY + pr)]
    if commit == pin or cached_is_ancestor(repo, commit, pin):
        note = "no upstream commits between the pin and this commit"
        return [Evidence(Kind.PATCH_ID, Says.UNAVAILABLE, note), Evidence(Kind.UPSTREAM_PR, Says.UNAVAILABLE, note)]
    pid = diff_patch_id(repo, patch.diff)
    found = change_history(repo, pin, commit, patch_id=pid, paths=patch.paths, pr=patch.upstream_pr)
    out = [_identity_evidence(found, "patch-id", Kind.PATCH_ID,
                              lambda e: f"upstream commit {e.commit[:12]} has the same patch-id",
                              "no commit since the pin has the same patch-id")]
    if patch.upstream_pr is None:
        out.append(Evidence(Kind.UPSTREAM_PR, Says.UNAVAILABLE, "the patch names no Upstream-PR"))
    else:
        n = patch.upstream_pr
        out.append(_identity_evidence(found, "upstream-pr", Kind.UPSTREAM_PR,
                                      lambda e: f"#{n} is in {e.commit[:12]} \"{e.subject}\"",
                                      f"no commit since the pin names #{n}"))
    reverts = found.reverts
    if found.reverted is not None:
        out.append(Evidence(Kind.REVERT, Says.NOT_LANDED, f"{found.story()}: the change is out again", reverts))
    elif found.relanded:
        out.append(Evidence(Kind.REVERT, Says.LANDED, f"{found.story()}: landed again", reverts))
    return out


def _identity_evidence(found: ChangeHistory, kind_name: str, kind: Kind,
                       landed: Callable[[HistoryEvent], str], none: str) -> Evidence:
    """One identity fact (patch-id or PR) in words; lineage decides whether a landing still stands."""
    current, reverted = found.stands(kind_name)
    if current is not None:
        return Evidence(kind, Says.LANDED, landed(current))
    if reverted is not None:
        return Evidence(kind, Says.NOT_LANDED, landed(reverted) + f", but reverted since: {found.story()}")
    return Evidence(kind, Says.NOT_LANDED, none)


def _decide(patch: Patch, commit: str, text: Text, evidence: tuple[Evidence, ...], probe: ProbeCheck | None) -> Verdict:
    def verdict(state: State, extra: tuple[Evidence, ...] = ()) -> Verdict:
        return Verdict(patch.filename, commit, state, evidence + extra, text.forward,
                       text.landed, text.needed, text.conflict, probe)

    if probe is not None and probe.outcome is ProbeOutcome.PASS:
        return verdict(State.LANDED)
    identity = [ev for ev in evidence if ev.kind in _IDENTITY and ev.says is Says.LANDED]
    probe_decides = probe is not None and probe.outcome is not ProbeOutcome.ERROR
    if identity and not probe_decides and text.forward in (Applies.CLEAN, Applies.OFFSETS) and not text.reverse:
        # Identity says landed, content says not: dropping on either could lose a fix; never decide alone.
        how = "cleanly" if text.forward is Applies.CLEAN else "with offsets"
        note = Evidence(Kind.DISAGREEMENT, Says.UNAVAILABLE,
                        f"{identity[0]}, yet the diff still applies {how} and does not reverse-apply; "
                        "no probe decides: a person must look")
        return verdict(State.DISPUTED, (note,))
    probe_failed = probe is not None and probe.outcome is ProbeOutcome.FAIL
    if not probe_failed and any(ev.says is Says.LANDED and ev.kind is not Kind.HUNKS for ev in evidence):
        return verdict(State.LANDED)
    if text.ambiguous and not probe_decides:
        # The file holds the pre-image and the post-image of a hunk, the post-image nearer its place: a copy
        # of either could be the one that moved; dropping could lose a fix and applying could hit a copy.
        note = Evidence(Kind.DISAGREEMENT, Says.UNAVAILABLE,
                        "both the pre-image and the post-image are in the file, the post-image nearer: "
                        + "; ".join(text.ambiguous) + "; no probe decides: a person must look")
        return verdict(State.DISPUTED, (note,))
    if text.landed and (text.needed or text.conflict):
        return verdict(State.PARTIAL)
    if text.forward is not Applies.NO:
        return verdict(State.NEEDED)
    if text.landed and not probe_failed:
        # every hunk is upstream on its own although the whole diff does not reverse-apply
        return verdict(State.LANDED)
    if probe_failed and (text.reverse or text.landed):
        note = Evidence(Kind.PROBE, Says.NOT_LANDED,
                        "the diff's content is upstream but the probe fails: a person must look")
        return verdict(State.CONFLICT, (note,))
    return verdict(State.CONFLICT)


_IDENTITY = (Kind.PATCH_ID, Kind.UPSTREAM_PR, Kind.REVERT)


def _tail(detail: str) -> str:
    detail = detail.strip()
    return f" ({detail})" if detail else ""
