"""Per-hunk coverage: which of a patch's hunks its probe proves. Each hunk is taken out alone; where the probe
still passes on the base plus the series with the patch so reduced, the probe does not see that hunk, and no
drop or narrowing may rest on the probe for it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vpatch import git
from vpatch.base import Reporter, silent
from vpatch.probes import workspace as probe_runs
from vpatch.probes.file import Probe, ProbeError, probe_for
from vpatch.probes.runner import ProbeOutcome, ProbeRequest, run_ahead, run_probe, says
from vpatch.probes.witness import stacked_tree
from vpatch.series import Patch, hunk_name


@dataclass(frozen=True)
class HunkCoverage:
    hunk: str  # hunk_name: "vllm/parser/qwen3.py hunk 1 (@@ -168,6 +168,29 @@)"
    outcome: ProbeOutcome | None  # the probe with every hunk but this one; None: the rest does not apply
    detail: str  # the probe's last line, or why it did not run

    @property
    def covered(self) -> bool | None:
        """True: without this hunk the probe fails (it sees the hunk); False: it still passes; None: unknown."""
        if self.outcome is ProbeOutcome.FAIL:
            return True
        if self.outcome is ProbeOutcome.PASS:
            return False
        return None


@dataclass(frozen=True)
class Coverage:
    patch: str
    probe: str
    ref: str
    hunks: tuple[HunkCoverage, ...]

    @property
    def uncovered(self) -> tuple[str, ...]:
        """The hunks the probe does not see: it passes without each of them."""
        return tuple(h.hunk for h in self.hunks if h.covered is False)

    @property
    def unknown(self) -> tuple[str, ...]:
        return tuple(h.hunk for h in self.hunks if h.covered is None)

    def says(self) -> str:
        covered = sum(1 for h in self.hunks if h.covered)
        text = f"probe {self.probe} covers {covered} of {len(self.hunks)} hunk{'s' if len(self.hunks) != 1 else ''}"
        if self.uncovered:
            text += "; NOT covered (the probe passes without it): " + "; ".join(self.uncovered)
        if self.unknown:
            text += "; unknown (the rest does not apply, or the probe errs without it): " + "; ".join(self.unknown)
        return text

    def to_json(self) -> dict[str, Any]:
        return {"patch": self.patch, "probe": self.probe, "ref": self.ref, "uncovered": list(self.uncovered),
                "unknown": list(self.unknown),
                "hunks": [{"hunk": h.hunk, "covered": h.covered,
                           "outcome": h.outcome.value if h.outcome is not None else None, "detail": h.detail}
                          for h in self.hunks]}


def hunks(patch: Patch) -> list[str]:
    """The patch's hunks by name, in its order."""
    return [hunk_name(fd, n, h) for fd in patch.files for n, h in enumerate(fd.hunks, 1)]


def without(patch: Patch, drop: str) -> bytes:
    """The patch's diff without the hunk named `drop` (a file left with no hunk is left out). Later hunks of the
    same file keep their headers: git applies a hunk where its old lines are, whatever its new start says."""
    out: list[bytes] = []
    for fd in patch.files:
        kept = [h for n, h in enumerate(fd.hunks, 1) if hunk_name(fd, n, h) != drop]
        if kept or not fd.hunks:
            out.append(fd.header + b"".join(h.text for h in kept))
    return b"".join(out)


def hunk_coverage(repo: Path, patches: Sequence[Patch], patch: Patch, *, base: str, ref: str, cache: Path | None = None,
                  use_cache: bool = True, report: Reporter = silent, jobs: int | None = None,
                  session: probe_runs.Session | None = None) -> Coverage:
    """The probe of `patch` on `base` + the series before it + the patch less one hunk, for each hunk. `session`:
    the command's (its trees and its warm interpreter, if any, serve these runs too); None: one of its own."""
    probe = probe_for(patch)
    if probe is None:
        raise ProbeError(f"{patch.filename} names no probe, so no hunk of it is covered by one",
                         hint=f"vpatch probe new {patch.number:04d} writes one")
    before = [p for p in patches if p.number < patch.number]
    start = stacked_tree(repo, before, base, before[-1], name=ref) if before else base
    names = hunks(patch)
    # a patch of one hunk less may be no diff at all: then the tree is the one before the patch
    trees: list[str | None] = [git.tree_with_patch(repo, start, rest) if rest else start
                               for rest in (without(patch, name) for name in names)]
    if session is None:
        with probe_runs.Session(cache=cache, jobs=jobs) as own:
            return _coverage(repo, probe, patch, names, trees, ref, own, use_cache, report)
    return _coverage(repo, probe, patch, names, trees, ref, session, use_cache, report)


def _coverage(repo: Path, probe: Probe, patch: Patch, names: Sequence[str], trees: Sequence[str | None], ref: str,
              session: probe_runs.Session, use_cache: bool, report: Reporter) -> Coverage:
    label = patch.name[:4]
    requests = [ProbeRequest(probe, tree, f"{label} on {ref} without {name}") for name, tree in zip(names, trees)
                if tree is not None]
    if requests:
        run_ahead(repo, requests, session, use_cache=use_cache, report=report)
    found = []
    for name, tree in zip(names, trees):
        if tree is None:
            found.append(HunkCoverage(name, None, "the rest of the patch does not apply without it"))
            continue
        result = run_probe(repo, probe, tree, use_cache=use_cache, report=report,
                           label=f"{label} on {ref} without {name}", session=session)
        # a command probe's detail starts with the last line it printed itself (probes/outcome.py: tail)
        first = (result.detail.strip().splitlines() or [""])[0]
        found.append(HunkCoverage(name, result.outcome, f"{says(result)} without it: {first}"))
    return Coverage(patch.filename, probe.name, ref, tuple(found))

