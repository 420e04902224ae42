"""What a deploy's two sides say against each other, as the operators' write-up is written: the verdict (better,
worse, within noise; for a rollback the failed check and the ledger lines that explain it), the start ledger
side by side, the timing figures under the stated rule, and where memory went per check phase. The console
tables, --json and the HTML page (deploy_html.py) all show these rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vpatch.deploy import (
    FLOOR_S,
    LEDGER_FIELDS,
    Call,
    Figures,
    LedgerRow,
    PassSeries,
    Side,
    absent_note,
    compare,
    ledger_rows,
    load_moved,
    rule,
    shown_per_worker,
    spread,
    stall_moved,
)

# (figure key in Figures, label, unit, higher is better)
_TIMINGS: tuple[tuple[str, str, str, bool], ...] = (
    ("ttft_samples", "time to first token", "s", False),
    ("decode_samples", "decode rate", "tok/s", True),
    ("prefill_samples", "long prefill", "s", False),
    ("makespan_samples", "parallel makespan", "s", False),
)
# Figures that are counts or the engine's own arithmetic, not timings: any difference is real. (Blocks held over
# predicted is not among them: below 1.0 is a reading that missed the last block, not an improvement; the block-cost
# check judges it.)
# (key, label, higher is better)
_COUNTS: tuple[tuple[str, str, bool], ...] = (
    ("kv_pool_tokens", "KV pool (tokens)", True),
    ("max_concurrency", "max concurrency", True),
    ("preemptions", "preemptions (parallel)", False),
    ("log_findings", "log findings", False),
)
# Ledger fields where more is better; every other memory or time figure costs more when it grows.
_LEDGER_MORE_IS_BETTER = {"kv_memory_gib", "kv_tokens", "max_concurrency", "free_at_start_gib", "device_total_gib"}
_DEFAULT_MIN_CHANGE = 0.10


@dataclass(frozen=True)
class TimingRow:
    label: str
    unit: str
    baseline: str
    candidate: str
    call: Call
    why: str


def sides_moved(base: Figures | None, cand: Figures) -> str | None:
    """Why the two sides' timings cannot be compared (the host's load or its CPU contention moved between them,
    or a side ran on a host too busy to time), or None."""
    # both sides ran on this host (a recorded baseline too: recorded here); an older record says no cores
    cores = cand.timing_cores or (base.timing_cores if base is not None else None)
    return (load_moved(base.timing_load if base is not None else None, cand.timing_load, cores)
            or stall_moved(base.timing_stall if base is not None else None, cand.timing_stall))


def timing_rows(base: Figures | None, cand: Figures) -> list[TimingRow]:
    """Each timing figure either side repeated: median (range, n) a side and the rule's call."""
    min_change = cand.timing_min_change if cand.timing_min_change is not None else _DEFAULT_MIN_CHANGE
    load = sides_moved(base, cand)
    out = []
    for key, label, unit, higher in _TIMINGS:
        b = getattr(base, key) if base is not None else None
        c = getattr(cand, key)
        no_rate = _no_rate(base, cand) if key == "decode_samples" else ""
        if not b and not c:
            if no_rate:  # the timing check ran and no answer gave a rate: say why, never drop the row
                out.append(TimingRow(label, unit, "-", "-", Call.UNJUDGED, f"not measured: {no_rate}"))
            continue
        call, why = compare(b, c, higher_is_better=higher, min_change=min_change, load=load,
                            floor=FLOOR_S if unit == "s" else 0.0)
        if call is Call.UNJUDGED and no_rate:
            why += f"; {no_rate}"
        sb, sc = spread(b), spread(c)
        out.append(TimingRow(label, unit, sb.shown() if sb else "-", sc.shown() if sc else "-", call, why))
    return out


def _no_rate(base: Figures | None, cand: Figures) -> str:
    """Why a side kept fewer decode rates than it sent short requests: the answers came in bursts (a loaded host
    hands over a whole answer in one read, and the spacing of its tokens then says nothing of the decode rate),
    or were too short to time. Empty for a record older than the count, or where every answer gave a rate."""
    parts = []
    for side, figures in (("baseline", base), ("candidate", cand)):
        if figures is None or figures.decode_bursts is None:
            continue
        sent = len(figures.ttft_samples or ())
        short = sent - len(figures.decode_samples or ()) - figures.decode_bursts
        if figures.decode_bursts:
            parts.append(f"the {side}'s {figures.decode_bursts} of {sent} answers came in bursts (under half the "
                         "gaps between tokens over 0.1 ms: a loaded host; measure again at a steady load)")
        if short > 0:
            parts.append(f"the {side}'s {short} of {sent} answers were under 16 tokens, too few to time")
    return " and ".join(parts) + (", which give no decode rate" if parts else "")


def the_rule(cand: Figures) -> str:
    return rule(cand.timing_min_change if cand.timing_min_change is not None else _DEFAULT_MIN_CHANGE)


@dataclass(frozen=True)
class PhaseRow:
    side: str
    check: str
    device: str
    peak_used_mib: float
    lowest_free_mib: float
    total_mib: float
    readings: int
    peak_resident_mib: float | None = None  # a container's own memory (without page cache); None: not read


def memory_phases(series: PassSeries, side: str) -> list[PhaseRow]:
    """Per check phase and device: the peak used, the lowest free and (a container) the peak resident, in the
    order the phases ran."""
    order: list[tuple[str, str]] = []
    groups: dict[tuple[str, str], list[Any]] = {}
    for m in series.memory:
        key = (m.check or "(between checks)", m.device)
        if key not in groups:
            order.append(key)
            groups[key] = []
        groups[key].append(m)
    rows = []
    for key in order:
        points = groups[key]
        resident = [p.resident_mib for p in points if p.resident_mib is not None]
        rows.append(PhaseRow(side, key[0], key[1], max(p.used_mib for p in points), min(p.free_mib for p in points),
                             points[0].total_mib, len(points), max(resident) if resident else None))
    return rows


def memory_phase_rows(base: Side | None, cand: Side) -> list[PhaseRow]:
    return (memory_phases(base.series, "baseline") if base else []) + memory_phases(cand.series, "candidate")


@dataclass(frozen=True)
class PhaseChange:
    check: str
    device: str
    baseline: PhaseRow | None
    candidate: PhaseRow | None

    @property
    def delta_mib(self) -> float | None:
        if self.baseline is None or self.candidate is None:
            return None
        return self.candidate.peak_used_mib - self.baseline.peak_used_mib

    @property
    def named(self) -> str:
        """"parallel: gpu0 peak +1,400 MiB (30,000 -> 31,400; lowest free 1,207 MiB)"; "" below 32 MiB: docker's
        and nvidia-smi's readings move by a few MiB between two readings of an idle server."""
        delta = self.delta_mib
        if delta is None or abs(delta) < 32:
            return ""
        assert self.baseline is not None and self.candidate is not None
        return (f"{self.check}: {self.device} peak {delta:+,.0f} MiB ({self.baseline.peak_used_mib:,.0f} -> "
                f"{self.candidate.peak_used_mib:,.0f}; lowest free {self.candidate.lowest_free_mib:,.0f} MiB"
                f"{self._resident_part(delta)})")

    @property
    def resident_delta_mib(self) -> float | None:
        b = self.baseline.peak_resident_mib if self.baseline else None
        c = self.candidate.peak_resident_mib if self.candidate else None
        return None if b is None or c is None else c - b

    def _resident_part(self, delta: float) -> str:
        """"; resident +402 MiB, the rest page cache" where the processes' own memory moved otherwise than the
        figure (on cgroup v1 a file's cache counts against the container that read it first)."""
        own = self.resident_delta_mib
        if own is None or abs(own - delta) < 32:
            return ""
        return f"; resident {own:+,.0f} MiB, the rest page cache"


def phase_changes(base: Side | None, cand: Side) -> list[PhaseChange]:
    """Per check phase and device, both sides side by side, in the candidate's order (then the baseline's rest)."""
    before = {(r.check, r.device): r for r in memory_phases(base.series, "baseline")} if base else {}
    after = {(r.check, r.device): r for r in memory_phases(cand.series, "candidate")}
    keys = list(after) + [k for k in before if k not in after]
    return [PhaseChange(k[0], k[1], before.get(k), after.get(k)) for k in keys]


def phase_differences(base: Side | None, cand: Side) -> list[str]:
    return [c.named for c in phase_changes(base, cand) if c.named]


def side_ledger_rows(base: Side | None, cand: Side) -> list[LedgerRow]:
    return ledger_rows(base.ledger if base else None, cand.ledger)


@dataclass(frozen=True)
class Comparison:
    better: list[str] = field(default_factory=list)
    worse: list[str] = field(default_factory=list)
    noise: list[str] = field(default_factory=list)
    unjudged: list[str] = field(default_factory=list)  # timings no rule can call (one side, or the load moved)
    failed: str | None = None  # a rolled-back deploy: the failed check, its figure and detail
    explained_by: list[str] = field(default_factory=list)  # the ledger and memory lines beside the failure

    def to_json(self) -> dict[str, Any]:
        return {"better": self.better, "worse": self.worse, "within_noise": self.noise, "not_judged": self.unjudged,
                "failed": self.failed,
                "explained_by": self.explained_by}

    def lines(self) -> list[str]:
        out = []
        if self.failed:
            out.append(f"failed: {self.failed}")
            out += [f"  beside it: {line}" for line in self.explained_by]
        out.append("better: " + ("; ".join(self.better) or "nothing measured better"))
        out.append("worse: " + ("; ".join(self.worse) or "nothing measured worse"))
        out.append("within noise: " + ("; ".join(self.noise) or "-"))
        if self.unjudged:
            out.append("not judged: " + "; ".join(self.unjudged))
        return out


def compare_sides(base: Side | None, cand: Side) -> Comparison:
    """Better, worse and within noise over the counts, the timings (by the rule) and the start ledger."""
    better: list[str] = []
    worse: list[str] = []
    noise: list[str] = []
    unjudged: list[str] = []
    if base is not None:
        for key, label, higher in _COUNTS:
            b, c = getattr(base.figures, key), getattr(cand.figures, key)
            if b is None or c is None or b == c:
                continue
            text = f"{label} {b:,.2f} -> {c:,.2f}" if isinstance(c, float) else f"{label} {b:,} -> {c:,}"
            (better if (c > b) == higher else worse).append(text)
    for row in timing_rows(base.figures if base else None, cand.figures):
        shown = "" if row.baseline == row.candidate == "-" else f" {row.baseline} -> {row.candidate} {row.unit}"
        text = f"{row.label}{shown} ({row.why})"
        if row.call is Call.BETTER:
            better.append(text)
        elif row.call is Call.WORSE:
            worse.append(text)
        elif row.call is Call.NOISE:
            noise.append(text)
        else:
            unjudged.append(text)
    ledger_lines = []
    for r in side_ledger_rows(base, cand):
        if not r.difference:
            continue
        grew = _mean(r.candidate) > _mean(r.baseline)
        one_start = " (one start each)" if r.unit == "s" else ""
        (better if grew == (r.field in _LEDGER_MORE_IS_BETTER) else worse).append(f"start: {r.difference}{one_start}")
        ledger_lines.append(f"start: {r.difference}")
    phases = phase_differences(base, cand)
    better_mem, worse_mem = _memory_lines(phase_changes(base, cand))
    better += better_mem
    worse += worse_mem
    failed_check = next((c for c in cand.checks if c.failed), None)
    failed = None
    explained: list[str] = []
    if failed_check is not None:
        failed = f"{failed_check.name}: {failed_check.figure}" + (f" ({failed_check.detail})" if failed_check.detail else "")
        memory_first = failed_check.name in ("memory", "parallel", "kv pool", "ceiling", "block cost", "started", "health")
        memory_lines = [line for line in ledger_lines if "GiB" in line or "tokens" in line or "concurrency" in line]
        other = [line for line in ledger_lines if line not in memory_lines]
        explained = (memory_lines + phases + other) if memory_first else (other + memory_lines + phases)
        if not explained:
            explained = _candidate_ledger_lines(cand)
    return Comparison(better, worse, noise, unjudged, failed, explained)


def _memory_lines(changes: list[PhaseChange]) -> tuple[list[str], list[str]]:
    """One line per device and direction: "memory: container peak +410 to +418 MiB in 7 of 7 phases (most in
    parallel: 1,279 -> 1,697 MiB; lowest free 22,408 MiB)"."""
    better: list[str] = []
    worse: list[str] = []
    for device in dict.fromkeys(c.device for c in changes):
        mine = [c for c in changes if c.device == device and c.delta_mib is not None]
        for grew, into in ((True, worse), (False, better)):
            named = [c for c in mine if c.named and ((c.delta_mib or 0) > 0) is grew]
            if not named:
                continue
            deltas = [c.delta_mib or 0.0 for c in named]
            most = max(named, key=lambda c: abs(c.delta_mib or 0.0))
            assert most.baseline is not None and most.candidate is not None
            span = f"{min(deltas):+,.0f}" if len(named) == 1 else f"{min(deltas):+,.0f} to {max(deltas):+,.0f}"
            into.append(f"memory: {device} peak {span} MiB in {len(named)} of {len(mine)} phases (most in {most.check}: "
                        f"{most.baseline.peak_used_mib:,.0f} -> {most.candidate.peak_used_mib:,.0f} MiB; lowest free "
                        f"{most.candidate.lowest_free_mib:,.0f} MiB)")
    return better, worse


def _candidate_ledger_lines(cand: Side) -> list[str]:
    """Without a baseline to differ from: the candidate's own start ledger, line by line."""
    return [f"start: {r.label} {shown_per_worker(r.candidate, r.unit)}" for r in ledger_rows(None, cand.ledger)
            if r.candidate]


def _mean(values: dict[str, float]) -> float:
    return sum(values.values()) / len(values) if values else 0.0


def to_json(base: Side | None, cand: Side) -> dict[str, Any]:
    """What --json carries beside the checks: verdict, ledger, timings with the rule, memory per phase."""
    return {
        "verdict": compare_sides(base, cand).to_json(),
        "ledger": [{"field": r.field, "label": r.label, "unit": r.unit, "baseline": r.baseline, "candidate": r.candidate,
                    "difference": r.difference or None} for r in side_ledger_rows(base, cand)],
        "ledger_absent": absent_notes(cand),
        "timing": {"rule": the_rule(cand.figures), "figures": [
            {"figure": t.label, "unit": t.unit, "baseline": t.baseline, "candidate": t.candidate,
             "call": t.call.value, "why": t.why} for t in timing_rows(base.figures if base else None, cand.figures)]},
        "memory_phases": [{"side": p.side, "check": p.check, "device": p.device, "peak_used_mib": round(p.peak_used_mib, 1),
                           "lowest_free_mib": round(p.lowest_free_mib, 1), "total_mib": round(p.total_mib, 1),
                           "readings": p.readings,
                           "peak_resident_mib": None if p.peak_resident_mib is None else round(p.peak_resident_mib, 1)}
                          for p in memory_phase_rows(base, cand)],
        "memory_phase_differences": phase_differences(base, cand),
    }


def absent_notes(cand: Side) -> list[str]:
    """Lines the candidate's release does not write at all (known from the patterns' release table)."""
    return absent_note(cand.ledger, [f.name for f in LEDGER_FIELDS])


def ledger_table_rows(base: Side | None, cand: Side) -> list[tuple[str, str, str, str]]:
    """(figure, baseline, candidate, difference) for the tables."""
    absent_b = "-" if base is None else "absent"
    return [(r.label, shown_per_worker(r.baseline, r.unit, absent_b), shown_per_worker(r.candidate, r.unit),
             r.difference) for r in side_ledger_rows(base, cand)]


def phase_table_rows(base: Side | None, cand: Side) -> list[tuple[str, str, str, str, str, str, str]]:
    """(check, device, baseline peak used, candidate peak used, difference, candidate lowest free, of) in MiB."""
    def peak(row: PhaseRow | None) -> str:
        return "-" if row is None else f"{row.peak_used_mib:,.0f}"
    rows = []
    for c in phase_changes(base, cand):
        either = c.candidate or c.baseline
        rows.append((c.check, c.device, peak(c.baseline), peak(c.candidate),
                     "" if c.delta_mib is None else f"{c.delta_mib:+,.0f}",
                     "-" if c.candidate is None else f"{c.candidate.lowest_free_mib:,.0f}",
                     f"{either.total_mib:,.0f}" if either is not None else ""))
    return rows


def timing_table_rows(base: Side | None, cand: Side) -> list[tuple[str, str, str, str]]:
    return [(f"{t.label} ({t.unit})", t.baseline, t.candidate, f"{t.call.value}: {t.why}")
            for t in timing_rows(base.figures if base else None, cand.figures)]
