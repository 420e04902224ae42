"""`vpatch forward`'s words and JSON: what was carried, the test's two results, upstream's tests, where it all is."""

from __future__ import annotations

from typing import Any

from vpatch.forward import ForwardStop, Recorded, Submission, Way


def forward_lines(done: Submission | ForwardStop) -> list[str]:
    """What a person reads after `vpatch forward NNNN`."""
    carry = done.carry
    if isinstance(done, ForwardStop):
        return [f"forward {done.patch}: {carry.case} on {done.ref}: {carry.decided_by}",
                *([carry.note] if carry.note else []),
                f"stopped: resolve it in {done.worktree}"
                + (f" (conflicts in {', '.join(done.conflicts)})" if done.conflicts else "")
                + f", `git add`, then `vpatch forward {done.patch[:4]} --continue`"]
    facts = done.evidence
    how = {Way.CARRY: f"carried as update would ({carry.case}: {carry.decided_by})",
           Way.NARROW: f"narrowed as update would: drops {len(carry.dropped)} hunk(s), keeps {', '.join(carry.kept)}",
           }.get(carry.way, carry.way.value)
    lines = [f"forward {done.patch} onto {facts.ref} ({facts.commit[:12]}): {how}"]
    if carry.way is Way.NARROW:
        lines += [f"  left out: {h.name} ({'rewritten upstream' if h.rewritten else 'upstream has it'})"
                  for h in carry.dropped]
        lines.append(f"  proof: {carry.proof}")
    made = "generated from the probe " + done.test.source if done.test.generated else done.test.source
    lines += [
        f"test {done.test.path} ({made}): {facts.without} without the patch, {facts.with_patch} with it",
        facts.regression,
        f"lint: {facts.lint}",
        f"branch {done.branch} at {done.commit[:12]} in {done.worktree}",
        f"format-patch: {done.mail}",
        f"PR body: {done.body}",
    ]
    return lines


def forward_json(done: Submission | ForwardStop) -> dict[str, Any]:
    """`vpatch forward --json`: the paths, REF, the test's two results and the regression summary."""
    carry = done.carry
    common = {"patch": done.patch, "way": carry.way.value, "case": carry.case, "decided_by": carry.decided_by,
              "worktree": str(done.worktree)}
    if isinstance(done, ForwardStop):
        return {**common, "outcome": "stopped", "ref": done.ref, "commit": done.commit,
                "conflicts": list(done.conflicts), "note": carry.note}
    facts = done.evidence
    return {
        **common, "outcome": "forwarded", "ref": facts.ref, "commit": facts.commit,
        "dropped_hunks": [{"name": h.name, "rewritten": h.rewritten, "where": h.where} for h in carry.dropped],
        "kept_hunks": list(carry.kept),
        "test": {**done.test.to_json(), "without_patch": facts.without, "with_patch": facts.with_patch},
        "regressions": done.regressions.to_json(),
        "lint": facts.lint,
        "branch": done.branch, "forward_commit": done.commit,
        "format_patch": str(done.mail), "pr_body": str(done.body), "seconds": done.seconds,
    }


def recorded_line(done: Recorded) -> str:
    said = f"Forwarded: {done.url}" + (f", Upstream-PR: {done.pr}" if done.pr is not None else "")
    return f"{done.file.name}: {said}" + ("" if done.changed else " (already so)")
