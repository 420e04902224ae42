"""The one seam between `vpatch forward` and the update's decision: the patch's disposition on REF
(`update.disposition_of`: the one status shows, `update --dry-run` prints and `update --to REF` carries out).

Everything else in `forward/` reads the `Carry` this module returns.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from vpatch import update
from vpatch.base import Reporter, VpatchError
from vpatch.series import Patch, Series

if TYPE_CHECKING:
    from pathlib import Path

    from vpatch.config import Config
    from vpatch.probes import Witness


class Way(str, Enum):
    """How the patch goes onto REF, in update's terms."""

    CARRY = "carry"  # update re-applies it there as it is
    NARROW = "narrow"  # update carries it without the hunks upstream has or rewrote, with narrowing's proof
    STOP = "stop"  # update stops at it: a person resolves the conflict in a work tree
    REFUSE = "refuse"  # update drops it there (landed), or refuses the move: nothing to send


@dataclass(frozen=True)
class LeftOut:
    """A hunk the carried patch leaves out: upstream has it, or rewrote its lines (narrowing's evidence)."""

    name: str
    rewritten: bool
    evidence: str
    where: str


@dataclass(frozen=True)
class Carry:
    """What update would do with the patch at REF, and the patch as update would carry it there."""

    way: Way
    patch: Patch  # as carried (narrowed for NARROW); the series' own otherwise
    case: str  # update's case word: landed, needed, partial, conflict, ...
    decided_by: str  # the evidence update's decision names
    landed_in: str | None = None  # a drop's first release (Applied-Upstream:)
    dropped: tuple[LeftOut, ...] = ()  # NARROW: the hunks left out
    kept: tuple[str, ...] = ()  # NARROW: the hunks carried
    proof: str = ""  # NARROW: narrowing's proof
    note: str = ""  # STOP: why it was not narrowed, which hunks upstream already has
    refused: str = ""  # REFUSE by a guard: update's own error, hint included


def carry_at(repo: Path, config: Config, series: Series, patch: Patch, ref: str, commit: str, *, pin: str,
             evidence: Witness, progress: Reporter) -> Carry:
    """What `vpatch update --to ref` would do with `patch`: its disposition there (`update.disposition_of`, the one
    status shows and the update carries out, with the command's Witness), as a Carry. At the pin itself nothing
    moves: the series says the patch is needed there, and it is carried as it is."""
    if commit == pin:
        return Carry(Way.CARRY, patch, "needed", f"{ref} is the pin: the series carries it there")
    row = update.disposition_of(repo, config, series, patch.filename, ref, evidence=evidence, progress=progress,
                                validator=functools.partial(update.validate_with_probes, evidence=evidence))
    if row.action is update.Action.REFUSE:
        return Carry(Way.REFUSE, patch, row.state, row.refused,
                     refused=row.refused + (f"\nhint: {row.refused_hint}" if row.refused_hint else ""))
    if row.action is update.Action.DROP:
        return Carry(Way.REFUSE, patch, row.state, row.decided_by, landed_in=row.landed_in)
    if row.action is update.Action.STOP:
        return Carry(Way.STOP, patch, row.state, row.decided_by, note=row.note)
    if row.retarget or row.relocate:
        # update carries it at the paths upstream moved its files or code to; forward sends the plain diff only
        raise VpatchError(f"{patch.filename}: on {ref} its files or code moved ({'; '.join(row.moves)}): "
                          "vpatch forward does not carry a moved patch yet",
                          hint=f"vpatch update --to {ref} carries it there; forward it from the new pin")
    if row.narrowing is None:
        return Carry(Way.CARRY, patch, row.state, row.decided_by)
    narrowed = row.narrowing
    return Carry(Way.NARROW, narrowed.patch(patch), row.state, row.decided_by,
                 dropped=tuple(LeftOut(d.name, d.rewritten, d.evidence, d.landed_in) for d in narrowed.dropped),
                 kept=narrowed.kept, proof=narrowed.proof)
