"""Narrow a partly-landed patch: drop the hunks upstream already has verbatim, keep the rest, and prove it.

`vpatch update` asks `narrow_series` about every patch that is PARTIAL on the new pin. A patch is narrowed
when the hunks the verdict found upstream (each reverse-applies on the new pin) also reverse-apply
together, the remaining hunks apply (cleanly, with offsets, or by a clean 3-way merge), and the proof
holds: on the files the patch touches, the new pin plus the narrowed patch is exactly the new pin plus
the old patch merged 3-way (upstream and the patch made the same change in the dropped hunks). Without
the old pin's blobs for that merge, the fallback proof is that the whole old diff reverse-applies on the
result: every post-image of the old patch is there. A patch with a probe must also re-validate it on the
new pin: fail there, pass with the narrowed patch. Otherwise the patch is not narrowed and the reason,
with the hunks upstream already has, goes to the person who resolves it.

A CONFLICT patch (hunks that neither apply nor are upstream verbatim: upstream rewrote those lines) is
narrowed through upstream's rewrite only with proof of behaviour instead of text: the other hunks apply,
the probe covers every hunk left out (on the old pin it fails without each of them: probes/coverage.py),
and on the new pin it fails unpatched and passes with the rest, with no regression in upstream's own tests
(Witness.validate). The probe then proves that what the dropped hunks did is upstream's behaviour now.
The narrowed patch's header and RETIRED.md name each dropped hunk, that proof, and the upstream commits
that changed its lines since the pin. A hunk the probe does not cover, or a rest the probe fails with,
stops for a person.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from vpatch import git
from vpatch.base import VpatchError
from vpatch.series import LAST_UPDATE, DroppedHunkRecord, Hunk, NarrowedPatch, Patch
from vpatch.status import search_landing
from vpatch.upstream import first_release, revert_commits
from vpatch.verdict import ApplyOutcome, State, Verdict, apply_check, hunk_name

_HUNK_HEAD = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")
_LAST_UPDATE_LINE = re.compile(rf"^{LAST_UPDATE}:[^\n]*$", re.MULTILINE)
_TRAILER = re.compile(r"^[A-Za-z][A-Za-z0-9-]*: ?.*$")

# (narrowed patch, the tree of the new pin with the patches before it and the narrowed patch) -> None
# when its probe fails without it and passes with it; raises VpatchError (or returns the reason) otherwise.
ProbeValidator = Callable[[Patch, str], "str | None"]
# a patch (as on the old pin) -> per hunk, in its order, whether its probe covers it there (coverage.py):
# True: the probe fails without the hunk; False: it passes without it; None: unknown.
CoverageCheck = Callable[[Patch], "Sequence[bool | None]"]
REWRITTEN_UPSTREAM = "Rewritten-Upstream"


@dataclass(frozen=True)
class DroppedHunk:
    name: str  # "path hunk N (@@ -a,b +c,d @@)", numbered as in the old patch
    evidence: str  # why it is upstream
    landed_in: str  # where it first is: "v1.1 (first commit 1a2b3c4d5e6f "subject", release v1.1; ...)"
    rewritten: bool = False  # upstream rewrote its lines (landed_in names the commits): the probe proves it


@dataclass(frozen=True)
class Narrowing:
    """What narrowing one patch drops and keeps, how the rest applies, and the proof."""

    file: str
    total: int  # hunks in the old patch
    dropped: tuple[DroppedHunk, ...]
    kept: tuple[str, ...]
    applies: str  # how the narrowed patch goes on the new pin: "cleanly", "with offsets", "by a clean 3-way merge"
    proof: str
    probe: str  # the probe's re-validation, or why there is none
    last_update: str  # the narrowed patch's Last-Update trailer (YYYY-MM-DD)

    @property
    def summary(self) -> str:
        return f"drops {len(self.dropped)} of {self.total} hunks"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Narrowing:
        dropped = tuple(DroppedHunk(**d) for d in data["dropped"])
        return cls(**{**data, "dropped": dropped, "kept": tuple(data["kept"])})

    def patch(self, old: Patch) -> Patch:
        """The narrowed patch itself, rebuilt from the old one (deterministic: state files keep only this record)."""
        return narrowed_patch(old, {d.name for d in self.dropped}, self.last_update,
                              note=header_note(self.dropped, self.proof))


class _NotNarrowed(Exception):
    pass


def narrow_series(
    repo: Path,
    patches: Sequence[Patch],
    verdicts: Mapping[str, Verdict],
    applied: Collection[str],
    *,
    pin: str,
    target: str,
    to_ref: str,
    today: str,
    branch: str | None = None,
    validate: ProbeValidator | None = None,
    covered: CoverageCheck | None = None,
    pin_ref: str | None = None,
    originals: Mapping[str, Patch] | None = None,
) -> dict[str, Narrowing | str]:
    """For each PARTIAL patch in `verdicts`: its Narrowing, or (a str) why it is not narrowed.

    `applied`: the patches the update applies on the new pin as they are; they are stacked under the
    later ones (with the narrowed ones) for the proof, as the update tree will hold them.
    `branch`: upstream's main branch when it has release branches (a git upstream), for the first release.
    `validate`: re-validates a narrowed patch's probe; None skips it (a dry run), which the record says.
    `covered`: each hunk's coverage by the patch's probe on the old pin, for a CONFLICT patch narrowed through
    upstream's rewrite (None, with `validate` None: a dry run, which the record says; else such a patch stops).
    `originals`: the patches as on the old pin (before following upstream's moves), for `covered`.
    """
    out: dict[str, Narrowing | str] = {}
    below: list[Patch] = []
    for patch in patches:
        verdict = verdicts.get(patch.filename)
        if verdict is not None and verdict.state is State.PARTIAL:
            try:
                narrowing, narrowed = _narrow_one(repo, patch, verdict, below, pin=pin, target=target,
                                                  to_ref=to_ref, today=today, branch=branch, validate=validate)
            except _NotNarrowed as exc:
                out[patch.filename] = f"not narrowed: {exc}. " + upstream_note(verdict)
                continue
            out[patch.filename] = narrowing
            below.append(narrowed)
        elif verdict is not None and verdict.state is State.CONFLICT and verdict.conflict_hunks:
            try:
                narrowing, narrowed = _narrow_rewritten(
                    repo, patch, (originals or {}).get(patch.filename, patch), verdict, below, pin=pin,
                    pin_ref=pin_ref or pin[:12], target=target, to_ref=to_ref, today=today, validate=validate,
                    covered=covered)
            except _NotNarrowed as exc:
                out[patch.filename] = f"not narrowed through upstream's rewrite: {exc}"
                continue
            out[patch.filename] = narrowing
            below.append(narrowed)
        elif patch.filename in applied:
            below.append(patch)
    return out


def upstream_note(verdict: Verdict) -> str:
    """For the person resolving a partial patch: which hunks to leave out, which to resolve."""
    text = "Upstream already has (leave these out): " + "; ".join(verdict.landed_hunks)
    rest = verdict.needed_hunks + verdict.conflict_hunks
    return text + (". Resolve only: " + "; ".join(rest) if rest else "")


def _narrow_one(repo: Path, patch: Patch, verdict: Verdict, below: Sequence[Patch], *, pin: str, target: str,
                to_ref: str, today: str, branch: str | None,
                validate: ProbeValidator | None) -> tuple[Narrowing, Patch]:
    drop = set(verdict.landed_hunks)
    names = [hunk_name(fd, n, h) for fd in patch.files for n, h in enumerate(fd.hunks, 1)]
    if not drop or not drop <= set(names) or drop == set(names):
        raise _NotNarrowed("the verdict's hunks do not match the patch's")
    if any(fd.binary or not fd.hunks for fd in patch.files):
        raise _NotNarrowed("it has a binary or hunk-less file change, which narrowing does not split")
    narrowed = narrowed_patch(patch, drop, today)
    landed_only = _diff_of(patch, keep=drop)
    work = _Index(repo, target, sorted({p for x in (*below, patch) for p in x.paths}))
    base = work.stack(below)
    if not work.applies(base, landed_only, reverse=True):
        raise _NotNarrowed(f"the hunks upstream has do not reverse-apply together on {to_ref}")
    applies, result = work.apply(base, narrowed.diff)
    if result is None:
        raise _NotNarrowed("the remaining hunks do not apply, not even with a 3-way merge: "
                           + "; ".join(verdict.conflict_hunks or verdict.needed_hunks))
    proof = work.prove(base, patch, result, to_ref)
    probe = "no probe"
    if narrowed.probe_path is not None:
        if validate is None:
            probe = f"{narrowed.trailer('Probe')}: not re-validated (dry run)"
        else:
            full = _full_tree(repo, target, [*below, narrowed])
            failure = _probe_failure(validate, narrowed, full)
            if failure:
                raise _NotNarrowed(f"its probe does not validate the narrowed patch on {to_ref}: {failure}")
            probe = f"{narrowed.trailer('Probe')} re-validated on {to_ref}: fails without the narrowed patch, passes with it"
    dropped = tuple(DroppedHunk(name, f"reverse-applies on {to_ref}: upstream has its post-image verbatim",
                                _hunk_landing(repo, patch, name, pin=pin, target=target, to_ref=to_ref,
                                              branch=branch))
                    for name in names if name in drop)
    kept = tuple(n for n in names if n not in drop)
    return Narrowing(patch.filename, len(names), dropped, kept, applies, proof, probe, today), narrowed


def _narrow_rewritten(repo: Path, patch: Patch, original: Patch, verdict: Verdict, below: Sequence[Patch], *,
                      pin: str, pin_ref: str, target: str, to_ref: str, today: str,
                      validate: ProbeValidator | None, covered: CoverageCheck | None) -> tuple[Narrowing, Patch]:
    """A CONFLICT patch without the hunks that no longer apply (and those upstream has verbatim), when the probe
    proves the behaviour of every hunk left out is upstream's now (module docstring)."""
    conflicting = set(verdict.conflict_hunks)
    landed = set(verdict.landed_hunks)
    drop = conflicting | landed
    names = [hunk_name(fd, n, h) for fd in patch.files for n, h in enumerate(fd.hunks, 1)]
    if not drop <= set(names):
        raise _NotNarrowed("the verdict's hunks do not match the patch's")
    if drop == set(names):
        raise _NotNarrowed("no hunk of it applies on " + to_ref)
    if any(fd.binary or not fd.hunks for fd in patch.files):
        raise _NotNarrowed("it has a binary or hunk-less file change, which narrowing does not split")
    if patch.probe_path is None:
        raise _NotNarrowed("it names no probe, so nothing proves that upstream's rewrite does what "
                           + ", ".join(sorted(conflicting)) + " did")
    narrowed = narrowed_patch(patch, drop, today)
    work = _Index(repo, target, sorted({p for x in (*below, patch) for p in x.paths}))
    base = work.stack(below)
    if landed and not work.applies(base, _diff_of(patch, keep=landed), reverse=True):
        raise _NotNarrowed(f"the hunks upstream has do not reverse-apply together on {to_ref}")
    applies, result = work.apply(base, narrowed.diff)
    if result is None:
        raise _NotNarrowed("the other hunks do not apply without them either: " + "; ".join(verdict.needed_hunks))
    probe_name = narrowed.trailer("Probe")
    if validate is None or covered is None:
        proof = f"not proven (dry run): {probe_name} is neither run on {pin_ref} without each dropped hunk nor on {to_ref}"
        probe = f"{probe_name}: not re-validated (dry run)"
    else:
        coverage = list(covered(original))
        if len(coverage) != len(names):
            raise _NotNarrowed(f"its probe's coverage on {pin_ref} does not name its {len(names)} hunks")
        blind = [n for n, c in zip(names, coverage) if n in conflicting and c is not True]
        if blind:
            raise _NotNarrowed(f"its probe does not cover {'; '.join(blind)} on {pin_ref} (it does not fail without "
                               "it there), so it cannot prove that upstream's rewrite does what the hunk did")
        full = _full_tree(repo, target, [*below, narrowed])
        failure = _probe_failure(validate, narrowed, full)
        if failure:
            raise _NotNarrowed(f"its probe does not validate the rest on {to_ref}: {failure}")
        proof = (f"{probe_name} covers each dropped hunk on {pin_ref} (fails without it there), fails on {to_ref} "
                 f"unpatched and passes with the rest, and upstream's own tests of the touched files show no "
                 f"regression: what the dropped hunks did is upstream's behaviour on {to_ref}")
        probe = f"{probe_name} re-validated on {to_ref}: fails without the narrowed patch, passes with it"
    dropped = []
    for name in names:
        if name in conflicting:
            commits = rewritten_by(repo, original, names.index(name), pin=pin, target=target)
            dropped.append(DroppedHunk(
                name, f"does not apply on {to_ref}: upstream rewrote its lines; " + (
                    f"{probe_name} covers it on {pin_ref} and passes on {to_ref} without it"
                    if validate is not None and covered is not None else "not proven (dry run)"),
                f"since {pin_ref} by: " + ("; ".join(commits) if commits else "(no commit found by git log -L)"),
                rewritten=True))
        elif name in landed:
            dropped.append(DroppedHunk(name, f"reverse-applies on {to_ref}: upstream has its post-image verbatim",
                                       f"{to_ref} (at or before commit {target[:12]})"))
    kept = tuple(n for n in names if n not in drop)
    narrowing = Narrowing(patch.filename, len(names), tuple(dropped), kept, applies, proof, probe, today)
    return narrowing, narrowing.patch(patch)


_PR = re.compile(r"\(#(\d+)\)")
# an issue or pull request a line of upstream's code cites: "issue 58227", "PR #123", "(#4567)", "pull/4567"
_CITED = re.compile(r"(?i)\b(issue|pr|pull request|pull|fixes|see)[ /]*#?(\d{3,})\b|\(#(\d{3,})\)")


def rewritten_by(repo: Path, patch: Patch, index: int, *, pin: str, target: str, context: int = 3) -> list[str]:
    """The upstream commits of pin..target that changed the old lines of the patch's hunk number `index` (counted
    over the whole patch), newest first: `12-digit id "subject" (PR #N)`; then the issues and pull requests the
    lines there cite (a release history of one commit per release has no PR in its subjects). The hunk's lines
    at the pin are mapped to the target's numbering through upstream's diff of the file (with `context` lines
    each side), then followed back with `git log -L`."""
    fd, hunk = [(fd, h) for fd in patch.files for h in fd.hunks][index]
    m = _HUNK_HEAD.match(hunk.header)
    assert m is not None
    first = int(m[1])
    last = first + max(int(m[2] if m[2] is not None else 1), 1) - 1
    span = git.line_span_at(repo, pin, target, fd.path, first, last, context=context)
    if span is None:
        return []
    records = git.line_log(repo, pin, target, [(fd.path, *span)])
    out = []
    for rec in records:
        pr = _PR.search(rec.subject)
        tag = git.tag_at(repo, rec.commit)
        out.append(f"{rec.commit[:12]} \"{rec.subject}\"" + (f" (PR #{pr[1]})" if pr else "")
                   + (f" (release {tag})" if tag else ""))
    text = (git.read_blobs(repo, target, [fd.path]).get(fd.path) or b"").decode("utf-8", "replace").splitlines()
    cited: list[str] = []
    for line in text[span[0] - 1:span[1]]:
        for c in _CITED.finditer(line):
            word = f"issue/PR #{c[3]}" if c[3] else f"{'issue' if c[1].lower() == 'issue' else 'PR'} #{c[2]}"
            if word not in cited:
                cited.append(word)
    if cited:
        out.append(f"its lines on {git.tag_at(repo, target) or target[:12]} cite {', '.join(cited)}")
    return out


def _probe_failure(validate: ProbeValidator, patch: Patch, tree: str) -> str | None:
    try:
        return validate(patch, tree)
    except VpatchError as exc:
        return exc.message


# --- the narrowed patch: same header and trailers, Last-Update moved, only the kept hunks -------------


def narrowed_patch(patch: Patch, drop: Collection[str], last_update: str, *, note: str = "") -> Patch:
    """`patch` without the hunks named in `drop`; later hunks' new-side line numbers follow. `note`: a paragraph
    for the message, above its trailers (header_note)."""
    start = len(patch.raw) - len(patch.diff)
    head = with_last_update(patch.raw[:start].decode("utf-8", "surrogateescape"), last_update)
    if note:
        head = with_paragraph(head, note)
    raw = head.encode("utf-8", "surrogateescape") + _diff_of(patch, drop=drop)
    return Patch.parse(raw, number=patch.number, slug=patch.slug, path=patch.path)


def _diff_of(patch: Patch, *, drop: Collection[str] = (), keep: Collection[str] | None = None) -> bytes:
    """The diff with only the hunks kept (every hunk not in `drop`, or only those in `keep`)."""
    out: list[bytes] = []
    for fd in patch.files:
        hunks = [(hunk_name(fd, n, h), h) for n, h in enumerate(fd.hunks, 1)]
        wanted = [(name, h) for name, h in hunks if (name in keep if keep is not None else name not in drop)]
        if not wanted:
            continue  # upstream has every hunk of this file
        shift = 0
        body = []
        for name, h in hunks:
            if (name, h) in wanted:
                body.append(_shifted(h, shift))
            else:
                shift += _delta(h)  # the new side no longer has this hunk's added or removed lines
        out.append(fd.header + b"".join(body))
    return b"".join(out)


def _delta(hunk: Hunk) -> int:
    m = _HUNK_HEAD.match(hunk.header)
    assert m is not None  # series.py checked every hunk header
    return int(m[4] if m[4] is not None else 1) - int(m[2] if m[2] is not None else 1)


def _shifted(hunk: Hunk, shift: int) -> bytes:
    if not shift:
        return hunk.text
    m = _HUNK_HEAD.match(hunk.header)
    assert m is not None
    new = f"+{int(m[3]) - shift}" + (f",{m[4]}" if m[4] is not None else "")
    old = f"-{m[1]}" + (f",{m[2]}" if m[2] is not None else "")
    _, _, rest = hunk.text.partition(b"\n")
    return f"@@ {old} {new} @@{m[5]}".encode() + b"\n" + rest


def header_note(dropped: Sequence[DroppedHunk], proof: str) -> str:
    """The paragraph a patch narrowed through upstream's rewrite carries in its message: each hunk dropped, the
    upstream commits that rewrote it, and the proof (empty when no hunk was rewritten)."""
    rewritten = [d for d in dropped if d.rewritten]
    if not rewritten:
        return ""
    lines = ["Narrowed through upstream's rewrite: left out, as upstream now does it itself:"]
    for d in rewritten:
        lines += [f"- {d.name}", f"  {REWRITTEN_UPSTREAM}: {d.landed_in}", f"  Evidence: {d.evidence}"]
    lines.append(f"Proof: {proof}")
    return "\n".join(lines)


def with_paragraph(head: str, paragraph: str) -> str:
    """The mail head with `paragraph` in its message, just above the trailers (or at its end)."""
    headers, sep, body = head.partition("\n\n")
    cut = body.rfind("\n---\n")
    message, tail = (body[:cut + 1], body[cut + 1:]) if cut >= 0 else (body, "")
    message = message.rstrip("\n")
    before, gap, last = message.rpartition("\n\n")
    if gap and all(_TRAILER.match(line) for line in last.splitlines()):
        message = before + "\n\n" + paragraph + "\n\n" + last
    else:
        message = message + "\n\n" + paragraph
    return headers + (sep or "\n\n") + message + "\n" + ("\n" + tail if tail else "")


def with_last_update(head: str, date: str) -> str:
    """The mail head with its Last-Update trailer set to `date` (added to the trailers when missing)."""
    found = list(_LAST_UPDATE_LINE.finditer(head))
    if found:
        m = found[-1]
        return head[:m.start()] + f"{LAST_UPDATE}: {date}" + head[m.end():]
    headers, sep, body = head.partition("\n\n")
    cut = body.rfind("\n---\n")
    message, tail = (body[:cut + 1], body[cut + 1:]) if cut >= 0 else (body, "")
    message = message.rstrip("\n")
    last = message.rsplit("\n\n", 1)[-1] if message else ""
    joint = "\n" if last and all(_TRAILER.match(line) for line in last.splitlines()) else "\n\n"
    message = (message + joint if message else "") + f"{LAST_UPDATE}: {date}\n"
    return headers + (sep or "\n\n") + message + ("\n" + tail if tail else "\n")


# --- the proof, on a temporary index of the touched files ------------------------------------------


class _Index:
    """Trees of the touched files only, built on temporary indexes of the upstream repository."""

    def __init__(self, repo: Path, commit: str, paths: Sequence[str]) -> None:
        self.repo, self.commit, self.paths = repo, commit, list(paths)

    @contextmanager
    def _at(self, tree: str | None) -> Iterator[dict[str, str]]:
        with git.temp_index(self.repo) as env:
            if tree is None:
                git.load_index(self.repo, env, self.commit, self.paths)
            else:
                git.load_index(self.repo, env, tree)
            yield env

    def stack(self, patches: Sequence[Patch]) -> str:
        """The new pin's touched files with `patches` applied, as the update tree will hold them."""
        with self._at(None) as env:
            for patch in patches:
                if git.apply_cached(self.repo, env, patch.diff, check=False).returncode != 0:
                    git.apply_cached(self.repo, env, patch.diff, check=False, three_way=True)
            return git.write_tree(self.repo, env)

    def applies(self, tree: str, diff: bytes, *, reverse: bool = False) -> bool:
        with self._at(tree) as env:
            return git.apply_cached(self.repo, env, diff, reverse=reverse).returncode == 0

    def apply(self, tree: str, diff: bytes) -> tuple[str, str | None]:
        """How `diff` goes on `tree` and the resulting tree (None: not even by a clean 3-way merge)."""
        with self._at(tree) as env:
            plain = git.apply_cached(self.repo, env, diff, check=False)
            if plain.returncode == 0:
                return ("with offsets" if "offset" in plain.err else "cleanly"), git.write_tree(self.repo, env)
        with self._at(tree) as env:
            merged = git.apply_cached(self.repo, env, diff, check=False, three_way=True)
            if merged.returncode != 0 or "with conflicts" in merged.err:
                return "no", None
            return "by a clean 3-way merge", git.write_tree(self.repo, env)

    def prove(self, base: str, old: Patch, narrowed_result: str, to_ref: str) -> str:
        """Why the new pin plus the narrowed patch is the old patch's intended result; raises when it is not."""
        how, intended = self.apply(base, old.diff)
        files = len(old.paths)
        if intended is not None and how == "by a clean 3-way merge":
            if intended != narrowed_result:
                differ = git.paths_differing(self.repo, intended, narrowed_result)
                raise _NotNarrowed(f"the narrowed patch's result differs from the old patch's 3-way merge on {to_ref} in "
                                   + ", ".join(differ))
            return (f"on {to_ref}, the narrowed patch and the old patch (3-way merged) give identical files "
                    f"({files} touched file{'s' if files != 1 else ''}, tree {narrowed_result[:12]})")
        if not self.applies(narrowed_result, old.diff, reverse=True):
            raise _NotNarrowed(f"the old patch's post-image is not all in {to_ref} plus the narrowed patch")
        return (f"the whole old diff reverse-applies on {to_ref} plus the narrowed patch: every post-image of "
                f"the old patch is there ({files} touched file{'s' if files != 1 else ''})")


def _full_tree(repo: Path, commit: str, patches: Sequence[Patch]) -> str:
    """The whole tree of `commit` with `patches` applied (what a probe runs on)."""
    with git.temp_index(repo) as env:
        git.load_index(repo, env, commit)
        for patch in patches:
            if git.apply_cached(repo, env, patch.diff, check=False).returncode != 0:
                git.apply_cached(repo, env, patch.diff, check=False, three_way=True)
        return git.write_tree(repo, env)


# --- where each dropped hunk first is upstream ---------------------------------------------------------


def _hunk_landing(repo: Path, patch: Patch, name: str, *, pin: str, target: str, to_ref: str,
                  branch: str | None) -> str:
    """The first commit (and release) that has the hunk, found by status's landing search (release branches
    followed, searched after the last revert that took the hunk out again)."""

    fd, hunk = next((fd, h) for fd in patch.files for n, h in enumerate(fd.hunks, 1) if hunk_name(fd, n, h) == name)
    one = (replace(fd, hunks=(hunk,)),)

    def has(commit: str) -> bool:
        found = apply_check(one, git.read_blobs(repo, commit, [fd.path]), reverse=True)
        return found.outcome in (ApplyOutcome.CLEAN, ApplyOutcome.OFFSETS)

    base = pin if git.is_ancestor(repo, pin, target) else git.merge_base(repo, pin, target)
    if base is None or base == target or not has(target):
        return f"{to_ref} (at or before commit {target[:12]})"
    if has(base):
        return f"{to_ref} (already upstream at the pin's commit {base[:12]})"
    reverts = revert_commits(repo, pin, target)

    floors: list[int] = []

    def after_last_revert(line: Sequence[str]) -> int:
        # the last revert on the line that leaves the hunk out: a landing before it does not stand
        out = [i for i, c in enumerate(line) if c in reverts]
        floors.append(next((i + 1 for i in reversed(out) if not has(line[i])), 0))
        return floors[-1]

    main = git.resolve_commit(repo, branch) if branch else None
    found = search_landing(repo, below=pin, top=target, main=main, landed=has, floor=after_last_revert)
    if found is None:
        return f"{to_ref} (at or before commit {target[:12]})"
    subject = git.commit_subject(repo, found.commit)
    proof = first_release(repo, found.commit, branch=branch)
    # one release: the first that has the hunk leads (the target only says where it was found)
    if proof is None:
        lead, where = to_ref, ", in no release yet"
    else:  # the proof names its own commit only when it is another one (a cherry-pick on a release branch)
        lead, where = proof.release, ("" if proof.commit == found.commit and not proof.picked else f", in it as {proof}")
    checks, searched = found.checks, found.candidates
    how = (f"bisected: {checks} check{'s' if checks != 1 else ''} over {searched} commits" if searched > 1
           else "the only commit after the last revert" if floors and floors[-1] else "the only commit since the pin")
    return f"{lead} (first commit {found.commit[:12]} \"{subject}\"{where}; {how})"


def verdicts_of(report: object) -> dict[str, Verdict] | None:
    """The new pin's verdict per patch file from a status report (its last target), if it is one."""
    rows = getattr(report, "patches", None)
    if not isinstance(rows, tuple):
        return None
    return {row.file: row.results[-1] for row in rows}


# --- how a narrowing is recorded: the commit message and patches/RETIRED.md ----------------------------


def message_lines(subject: str, narrowing: Narrowing) -> list[str]:
    """The commit message's lines for one narrowed patch."""
    lines = [f"- {narrowing.file}: {subject}: {narrowing.summary}, keeps {len(narrowing.kept)}"]
    for hunk in narrowing.dropped:
        label = REWRITTEN_UPSTREAM if hunk.rewritten else "Applied-Upstream"
        lines += [f"  Dropped: {hunk.name}", f"    {label}: {hunk.landed_in}", f"    Evidence: {hunk.evidence}"]
    lines += [f"  Kept: {name}" for name in narrowing.kept]
    lines += [f"  Applies {narrowing.applies}; Last-Update: {narrowing.last_update}", f"  Proof: {narrowing.proof}",
              f"  Probe: {narrowing.probe}"]
    return lines


def record(patch: Patch, narrowing: Narrowing, *, retired_by: str, last_version: str) -> NarrowedPatch:
    """The patches/RETIRED.md entry of a narrowing."""
    dropped = tuple(DroppedHunkRecord(h.name, h.landed_in, h.evidence,
                                      label=REWRITTEN_UPSTREAM if h.rewritten else "Applied-Upstream")
                    for h in narrowing.dropped)
    return NarrowedPatch(patch.number, patch.slug, patch.subject, narrowing.summary, dropped, narrowing.kept,
                         narrowing.proof, narrowing.probe, retired_by, last_version)
