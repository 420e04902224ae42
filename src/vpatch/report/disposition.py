"""A disposition (update/disposition.py) in words and in JSON: what `status` shows per target, `update --dry-run`
prints and `update` reports, one wording for all three."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vpatch.update import Action

if TYPE_CHECKING:
    from vpatch.update import PatchPlan


def reason(row: PatchPlan) -> str:
    """Why the disposition is what it is: the evidence that decided it, and for a narrowing what it leaves out."""
    if row.action is Action.REFUSE:
        return row.refused
    if row.action is Action.NARROW and row.narrowing is not None:
        return f"{row.narrowing.summary}: " + "; ".join(
            f"{h.name} rewritten upstream {h.landed_in}" if h.rewritten else f"{h.name} upstream in {h.landed_in}"
            for h in row.narrowing.dropped)
    return "\n".join(r for r in (row.decided_by, row.note) if r)


def proof(row: PatchPlan) -> str:
    """What the action rests on beyond the verdict: a narrowing's proof, a drop's landing, a carried patch's probe
    re-validated on the new pin and a moved patch's proof ("" when there is nothing more)."""
    parts = []
    if row.action is Action.DROP and row.landed_in:
        parts.append(f"Applied-Upstream: {row.landed_in}")
    if row.narrowing is not None:
        parts.append(row.narrowing.proof)
    if row.move_proof:
        parts.append(row.move_proof)
    if row.validated:
        parts.append(f"{row.validated} re-validated on the target: fails without the patch, passes with it")
    return "; ".join(parts)


def disposition_json(row: PatchPlan) -> dict[str, Any]:
    """The `disposition` object of `status --json` (per target) and of `update --json` (per patch)."""
    narrowing = row.narrowing
    return {
        "action": row.action.value,
        "case": row.case.value,
        "reason": reason(row),
        "proof": proof(row) or None,
        "refused_by": row.refused_by.value if row.refused_by is not None else None,
        "dropped_hunks": [] if narrowing is None else [
            {"hunk": h.name, "rewritten": h.rewritten, "upstream": h.landed_in, "evidence": h.evidence}
            for h in narrowing.dropped],
        "kept_hunks": [] if narrowing is None else list(narrowing.kept),
        "needs_person": row.needs_person,
    }


def cell_words(row: PatchPlan) -> str:
    """The disposition in a status cell: the dry run's verb, and for a narrowing the hunks it leaves out."""
    words = row.verb(planned=True)
    if row.action is Action.NARROW and row.narrowing is not None:
        left = "; ".join(h.name.split(" (@@")[0] + (" rewritten upstream" if h.rewritten else " upstream")
                         for h in row.narrowing.dropped)
        return f"{words}: {row.narrowing.summary}: {left}; proven"
    if row.action is Action.REFUSE:
        return f"{words}: {row.refused}"
    return words
