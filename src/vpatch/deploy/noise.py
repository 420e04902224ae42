"""When a difference between two builds' timings is real: the one rule the report states and applies.

Each timing figure is measured `repeats` times a side. A difference is called real only when the two sides'
ranges do not overlap at all (every candidate sample beyond every baseline sample) and the medians differ by at
least `min_change` of the baseline's; anything else is "within noise". With n samples a side, two builds that do
not differ separate completely by chance 2 / C(2n, n) of the time: 1 in 10 at n=3, 1 in 126 at n=5.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True)
class Spread:
    n: int
    median: float
    low: float
    high: float

    def shown(self, digits: int = 2) -> str:
        return f"{self.median:,.{digits}f} ({self.low:,.{digits}f}-{self.high:,.{digits}f}, n={self.n})"


def spread(samples: Sequence[float] | None) -> Spread | None:
    if not samples:
        return None
    return Spread(len(samples), statistics.median(samples), min(samples), max(samples))


class Call(str, Enum):
    BETTER = "better"
    WORSE = "worse"
    NOISE = "within noise"
    UNJUDGED = "not judged"  # a side has no samples, or too few for the rule


def chance(n_base: int, n_cand: int) -> float:
    """How often two equal builds' samples separate completely by chance (both orders counted)."""
    return 2 / math.comb(n_base + n_cand, n_base)


# A time figure's medians must also differ by at least this much: below it, a shared host's scheduling moves the
# same image between two passes (measured in the suite's cold run on the 2-core test machine at load ~4: the same
# image's time to first token 0.04 s median in one pass, 0.01 s in the next, both ranges tight). On the GPU host the
# times the report compares are seconds (a 180,000-token prefill), where 50 ms never decides.
FLOOR_S = 0.05


def rule(min_change: float) -> str:
    """The rule in one sentence, for the page."""
    return (f"A timing difference is called real only when the ranges of the repeats do not overlap and the medians "
            f"differ by at least {min_change:.0%} (and, for a time, by at least {FLOOR_S * 1000:.0f} ms); two equal "
            f"builds separate completely by chance 1 time in "
            f"{1 / chance(3, 3):.0f} with 3 repeats a side, 1 in {1 / chance(5, 5):.0f} with 5. Everything else is "
            f"within noise. Where the host's load average differs by more than {LOAD_FACTOR}x between the sides, "
            f"or passes {BUSY_PER_CORE:.0f} per core on either, or the share of time some task waited for a CPU "
            f"differs between the sides by more than {STALL_APART * 100:.0f} points, or reaches {STALL_BUSY:.0%} on either, "
            f"a difference is not judged.")


# The sides ran under different load when the host's load average differs by more than this factor (and by more
# than one runnable process): measured on the 2-core test machine, the same image's TTFT went from 0.05 to 0.38 s
# median when the load went from 5 to 24 between the baseline and the candidate.
LOAD_FACTOR = 1.5


# A side's repeats ran on a host too busy to time anything when its load average passed this many runnable
# processes per core: the times are then the scheduler's. Measured in a shuffled run of the suite beside two busy
# loops on the 2-core test machine: the same image's time to first token 0.12 s median (0.10-0.18) at load 6.1-6.5,
# 0.01 s (0.01-0.02) at 5.0, both ranges tight and apart, the loads within LOAD_FACTOR of each other.
BUSY_PER_CORE = 2.0


# The sides ran under different contention for the CPU when the share of their repeats' wall time in which some
# task on the host waited for a CPU (the kernel's pressure stall count) differs by more than this. Measured on the
# 2-core test machine: the tiny server's own repeats stall 17-19% of the time with nothing else running (three
# runs, the two sides within 2 points of each other); three busy loops alone stall 50%. The load average, a
# one-minute decaying mean, missed the burst in a CI run where the same image's baseline ran beside another test's
# busy phase (its parallel makespan up to 1.19 s against the candidate's 0.11 s) and one figure was called better.
STALL_APART = 0.15
# A side's repeats ran on a saturated host when some task waited for a CPU this share of their time or more, however
# alike the two sides: measured beside two busy loops on the 2-core test machine (load 3.7 on both sides, under
# BUSY_PER_CORE), the same image's stall shares 93% and 96%, its time to first token 0.01 s median (0.01-0.04) on one
# side, 0.08 s (0.07-0.09) on the other, called worse. Quiet, the tiny server's repeats stall 17-19%; three busy
# loops alone, 50%.
STALL_BUSY = 0.75


def stall_moved(base: float | None, cand: float | None) -> str | None:
    """Why the two sides' timings cannot be compared, or None: the host's CPU stall share (Figures.timing_stall)
    moved between them by more than STALL_APART, or reached STALL_BUSY on either side. None where a side has no
    stall count."""
    if base is None or cand is None:
        return None
    if max(base, cand) >= STALL_BUSY:
        return (f"some task on the host waited for a CPU {base:.0%} of the baseline's repeats and {cand:.0%} of the "
                "candidate's: a saturated host, whose times are the scheduler's")
    if abs(base - cand) <= STALL_APART:
        return None
    return (f"the share of time some task on the host waited for a CPU moved from {base:.0%} to {cand:.0%} between "
            "the sides")


def load_moved(base: tuple[float, float] | None, cand: tuple[float, float] | None, cores: int | None = None
               ) -> str | None:
    """Why the two sides' timings cannot be compared, or None: the host's load moved between them, or (`cores`:
    the host's, where known) a side ran at more than BUSY_PER_CORE runnable processes per core."""
    if base is None or cand is None:
        return None
    b, c = max(base), max(cand)
    low, high = min(b, c), max(b, c)
    if high - low > 1.0 and high > LOAD_FACTOR * max(low, 0.1):
        return f"the host's load average moved from {b:.1f} to {c:.1f} between the sides"
    if cores and high > BUSY_PER_CORE * cores:
        side = "the baseline's" if b >= c else "the candidate's"
        return (f"the host's load average reached {high:.1f} on {cores} cores during {side} repeats (over "
                f"{BUSY_PER_CORE:.0f} runnable processes per core: the times are the scheduler's)")
    return None


def compare(base: Sequence[float] | None, cand: Sequence[float] | None, *, higher_is_better: bool,
            min_change: float, min_n: int = 3, load: str | None = None, floor: float = 0.0) -> tuple[Call, str]:
    """(call, why in words) for one timing figure; `load`: why the sides ran under different load (load_moved),
    which leaves a difference unjudged rather than called real; `floor`: the least difference of the medians, in
    the figure's unit, that can be real (FLOOR_S for a time)."""
    b, c = spread(base), spread(cand)
    if b is None or c is None:
        return Call.UNJUDGED, "measured on one side only"
    if b.n < min_n or c.n < min_n:
        return Call.UNJUDGED, f"{b.n} and {c.n} samples: fewer than {min_n} a side, no rule can tell"
    change = (c.median - b.median) / b.median if b.median else math.inf
    apart = c.low > b.high or c.high < b.low
    text = f"median {change:+.0%}"
    if not apart:
        return Call.NOISE, f"{text}, ranges overlap"
    if abs(change) < min_change:
        return Call.NOISE, f"{text}, ranges apart but under {min_change:.0%}"
    if abs(c.median - b.median) < floor:
        return Call.NOISE, f"{text}, ranges apart but the medians {abs(c.median - b.median) * 1000:.0f} ms apart, " \
                           f"under {floor * 1000:.0f} ms"
    if load is not None:
        return Call.UNJUDGED, f"{text}, ranges apart, but {load}: measure again at a steady load"
    up = c.median > b.median
    better = up == higher_is_better
    return (Call.BETTER if better else Call.WORSE), f"{text}, ranges apart (chance {chance(b.n, c.n):.1%})"
