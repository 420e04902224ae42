"""A deploy's report as one self-contained HTML page: the decision, the check tables, then the plots.

Rendered from the deploy's record (deploy/record.py), so it can be made again after the deploy ended or was
killed. Plots are matplotlib figures inlined as SVG (no script, no network: it opens from disk or as a CI
artifact); each has the table of its numbers under it, and the page reads the same with the plots missing.
Each plotted series is an SVG group whose id names it, with one marker per sample (the browser test counts them).
"""

from __future__ import annotations

import html
import io
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vpatch.deploy import DeployRecord, Figures, PassSeries, Side, Source, age
from vpatch.report import deploy as deploy_report
from vpatch.report import deploy_verdict

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from vpatch.deploy import LiveReport

_CSS = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 1.5em auto; max-width: 1100px; padding: 0 1em; color: #222; }
h1 { font-size: 1.35em; margin-bottom: .2em; } h2 { font-size: 1.1em; margin-top: 1.8em; }
.decision { font-size: 1.15em; font-weight: 600; padding: .6em .8em; border-radius: 4px; }
.deployed { background: #e3f4e1; } .rolled { background: #fbe4e1; } .unfinished { background: #fff3cd; }
table { border-collapse: collapse; margin: .5em 0; font-size: .92em; }
th, td { border: 1px solid #ccc; padding: .2em .5em; text-align: left; vertical-align: top; }
td.fail, td.error { color: #a40000; font-weight: 600; } td.pass { color: #1a6b1a; }
figure { margin: 1em 0 2em; } figcaption { font-weight: 600; margin-bottom: .3em; }
.plot svg { max-width: 100%; height: auto; } .muted { color: #666; }
.verdict li { margin: .15em 0; } .verdict .worse { color: #a40000; } .verdict .better { color: #1a6b1a; }
"""

_COLORS = {"baseline": "#7f7f7f", "candidate": "#1f77b4"}


@dataclass(frozen=True)
class Plot:
    """One plot: its id, caption, the SVG (None when it could not be drawn), and its numbers as a table."""

    id: str
    caption: str
    svg: str | None
    samples: int  # the samples plotted: one marker each in the SVG groups whose id starts with `counted`
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    counted: str = ""  # default: the plot's id followed by "-"


def decision_line(record: DeployRecord, phase: str | None = None) -> tuple[str, str]:
    """(css class, the decision and why in one sentence)."""
    cand = record.candidate.checks if record.candidate else ()
    failed = next((c for c in cand if c.failed), None)
    if record.decision == "deployed":
        return "deployed", (f"Deployed: {record.image} passed all {sum(c.status.value == 'pass' for c in cand)} "
                            f"checks it ran and serves as {record.container}.")
    if record.decision is None:
        where = f" during {phase}" if phase else ""
        return "unfinished", (f"Unfinished: the deploy of {record.image} stopped{where} without deciding (killed?); "
                              f"`vpatch deploy {record.definition} --rollback` restores production.")
    why = f"the {failed.name} check failed: {failed.figure}" + (f" ({failed.detail})" if failed and failed.detail else "") \
        if failed else record.rollback
    verb = record.decision[0].upper() + record.decision[1:]
    return "rolled", f"{verb}: {why}."


def render(record: DeployRecord, *, phase: str | None = None) -> str:
    """The whole page. `phase`: the journal's phase, for a deploy that did not finish."""
    css, sentence = decision_line(record, phase)
    base, cand = record.baseline, record.candidate
    parts = [f"<h1>deploy {_e(record.definition)}: {_e(record.image)} as {_e(record.container)}</h1>",
             f'<p id="decision" class="decision {css}">{_e(sentence)}</p>',
             f"<p>{_e(_baseline_note(base))} Started {_e(record.started)}"
             + (f", finished {_e(record.finished)}" if record.finished else "") + ".</p>"]
    if record.rollback:
        parts.append(f"<p>{_e(record.rollback)}</p>")
    if cand is not None:
        parts.append(_verdict(base, cand))
    parts.append("<h2>Checks</h2>")
    rows = deploy_report.check_rows_of(base.checks if base else (), cand.checks if cand else ())
    parts.append(_table(("check", "baseline", "candidate", "candidate figure", "s"), rows, status_columns=(1, 2)))
    figure_rows = deploy_report.figure_rows_of(base.figures if base else Figures(), cand.figures if cand else Figures())
    if figure_rows:
        parts.append("<h2>Baseline against candidate</h2>")
        parts.append(_table(("figure", "baseline", "candidate"), figure_rows))
    if cand is not None:
        parts += _comparisons(base, cand)
    if record.steps:
        parts.append("<p class=muted>steps: " + _e(", ".join(f"{n} {s:.1f}s" for n, s in record.steps)) + "</p>")
    parts.append("<h2>Plots</h2>")
    for plot in plots(base.series if base else PassSeries(), cand.series if cand else PassSeries()):
        parts.append(_figure(plot))
    return ("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
            f"<title>deploy {_e(record.definition)}: {_e(sentence[:80])}</title><style>{_CSS}</style></head>"
            "<body>\n" + "\n".join(parts) + "\n</body></html>\n")


def live_page(image: str, result: LiveReport, *, started: str) -> str:
    """`vpatch verify IMAGE --live`'s page: the verdict in one sentence, then every case of every patch's live
    check (a side container, no time series: the cases are the whole record)."""
    outcomes = result.candidate
    failed = [o for o in outcomes if not o.ok]
    cases = sum(len(o.cases) for o in outcomes)
    if not outcomes:
        css, sentence = "unfinished", f"Nothing to run: no patch in {image} names a Live-Check; nothing was started."
    elif failed:
        css, sentence = "rolled", (f"Failed: {image} fails the live check of {', '.join(o.planned.patch for o in failed)} "
                                   f"({sum(not c.ok for o in failed for c in o.cases)} of {cases} case(s)).")
    else:
        css, sentence = "deployed", f"Passed: {image} shows every fix its live checks name ({cases} case(s))."
    rows = [(o.planned.patch, o.planned.role.value, o.planned.file, c.name, "pass" if c.ok else "fail",
             f"{c.seconds:.1f}", "; ".join(c.problems)) for o in outcomes for c in o.cases]
    parts = [f"<h1>verify --live: {_e(image)}</h1>", f'<p id="decision" class="decision {css}">{_e(sentence)}</p>',
             f"<p>Started {_e(started)} on a container of its own (production was not touched).</p>"]
    parts += [f"<p class=muted>note: {_e(note)}</p>" for note in result.plan.notes]
    if rows:
        parts.append("<h2>Live checks</h2>")
        parts.append(_table(("patch", "role", "check file", "case", "result", "s", "problems"), rows, status_columns=(4,)))
    return ("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
            f"<title>verify --live {_e(image)}: {_e(sentence[:80])}</title><style>{_CSS}</style></head>"
            "<body>\n" + "\n".join(parts) + "\n</body></html>\n")


def _verdict(base: Side | None, cand: Side) -> str:
    """The verdict on top, as the write-up is written: the failure and what stands beside it, then better,
    worse and within noise."""
    found = deploy_verdict.compare_sides(base, cand)
    items = []
    if found.failed:
        beside = "".join(f"<li>{_e(line)}</li>" for line in found.explained_by)
        items.append(f'<li class="worse"><b>failed</b> {_e(found.failed)}' + (f"<ul>{beside}</ul>" if beside else "")
                     + "</li>")
    for css, label, lines in (("better", "better", found.better), ("worse", "worse", found.worse),
                              ("noise", "within noise", found.noise), ("unjudged", "not judged", found.unjudged)):
        if css == "unjudged" and not lines:
            continue
        shown = "; ".join(lines) if lines else ("-" if css == "noise" else f"nothing measured {label}")
        items.append(f'<li class="{css}"><b>{_e(label)}</b>: {_e(shown)}</li>')
    return f'<h2>Verdict</h2><ul id="verdict" class="verdict">{"".join(items)}</ul>'


def _comparisons(base: Side | None, cand: Side) -> list[str]:
    """The start ledger, the repeated timings with the rule, and memory per check phase."""
    parts = []
    ledger = deploy_verdict.ledger_table_rows(base, cand)
    if ledger:
        parts.append('<h2 id="ledger">Start ledger</h2><p class=muted>From each server\'s own start log, per worker '
                     "(card) where vLLM writes it; a line the server did not write is absent, never guessed.</p>")
        parts.append(_table(("figure", "baseline", "candidate", "difference"), ledger))
        notes = deploy_verdict.absent_notes(cand)
        if notes:
            parts.append("<p class=muted>" + _e("; ".join(notes)) + "</p>")
    timing = deploy_verdict.timing_table_rows(base, cand)
    if timing:
        parts.append('<h2 id="timing">Timings, repeated</h2>')
        parts.append(f'<p id="rule">{_e(deploy_verdict.the_rule(cand.figures))}</p>')
        parts.append(_table(("figure", "baseline median (range, n)", "candidate median (range, n)", "call"), timing))
    phases = deploy_verdict.phase_table_rows(base, cand)
    if phases:
        parts.append('<h2 id="memory-phases">Memory per check phase</h2>')
        parts.append(_table(("check", "device", "baseline peak used MiB", "candidate peak used MiB", "difference",
                             "candidate lowest free MiB", "of MiB"), phases))
    return parts


def _baseline_note(base: Side | None) -> str:
    if base is None or base.source == Source.NONE:
        return "Baseline: none (a first deploy, or --baseline none)."
    if base.source == Source.RECORDED:
        return (f"Baseline: the figures recorded when the running image was deployed ({base.recorded_at}, "
                f"{age(base.recorded_at)}); production was not sent a request.")
    return "Baseline: measured on production just before the switch."


def _e(text: object) -> str:
    return html.escape(str(text))


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], *, status_columns: tuple[int, ...] = ()) -> str:
    out = ["<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in header) + "</tr>"]
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            cls = f' class="{_e(cell)}"' if i in status_columns and cell in ("pass", "fail", "error") else ""
            cells.append(f"<td{cls}>{_e(cell)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    return "\n".join(out) + "</table>"


def _figure(plot: Plot) -> str:
    body = f'<div class="plot">{plot.svg}</div>' if plot.svg else '<p class="muted">(plot not drawn: matplotlib is missing)</p>'
    numbers = _table(plot.header, plot.rows)
    if len(plot.rows) > 25:
        numbers = f"<details><summary>the {len(plot.rows)} numbers</summary>{numbers}</details>"
    return (f'<figure id="plot-{plot.id}" data-plot="{plot.id}" data-samples="{plot.samples}" '
            f'data-counted="{plot.counted or plot.id + "-"}">'
            f"<figcaption>{_e(plot.caption)}</figcaption>{body}{numbers}</figure>")


def plots(base: PassSeries, cand: PassSeries) -> list[Plot]:
    """The plots both sides have data for, in the report's order (empty ones are left out)."""
    sides = (("baseline", base), ("candidate", cand))
    out = [_kv_blocks(sides), _requests(sides), _parallel(sides), _memory(sides), _throughput(sides)]
    return [p for p in out if p is not None]


# -- the plots ----------------------------------------------------------------------------------------------

def _draw(plot_id: str, panels: int, draw: Any) -> str | None:
    """`draw(axes)` on a matplotlib figure, as inline SVG; None without matplotlib (the tables still stand)."""
    try:
        import matplotlib  # lazy: heavy (about a second), only when a report is drawn
        from matplotlib.figure import Figure  # lazy: with matplotlib above
    except ImportError:
        return None
    # Ids in the SVG are hashes salted with this; each plot its own salt, so two inline SVGs of one page
    # never share a clip-path id (the second would clip to the first's box).
    with matplotlib.rc_context({"svg.hashsalt": f"vpatch-{plot_id}", "svg.fonttype": "none", "font.size": 9}):
        fig = Figure(figsize=(9.5, 3.2 if panels == 1 else 3.4), layout="constrained")
        axes = fig.subplots(1, panels, squeeze=False)[0]
        draw(list(axes))
        out = io.StringIO()
        fig.savefig(out, format="svg", metadata={"Date": None})
    text = out.getvalue()
    text = text[text.index("<svg"):]  # the XML prolog and doctype do not belong inside HTML
    return re.sub(r"\s*<metadata>.*?</metadata>", "", text, count=1, flags=re.S)  # RDF boilerplate, per plot


def _line(ax: Axes, gid: str, xs: Sequence[float], ys: Sequence[float], *, label: str, color: str,
          marker: str = "o", linestyle: str = "-", size: float = 3) -> None:
    (line,) = ax.plot(xs, ys, marker=marker, markersize=size, linestyle=linestyle, linewidth=1, color=color, label=label)
    line.set_gid(gid)


def _kv_blocks(sides: Sequence[tuple[str, PassSeries]]) -> Plot | None:
    have = [(name, s) for name, s in sides if s.block_cost]
    if not have:
        return None
    count = sum(len(s.block_cost) for _, s in have)

    def draw(axes: list[Axes]) -> None:
        ax = axes[0]
        for name, s in have:
            t0 = s.block_cost[0].t
            xs = [p.t - t0 for p in s.block_cost]
            _line(ax, f"kv-{name}-held", xs, [p.held for p in s.block_cost], label=f"{name}: blocks held",
                  color=_COLORS[name])
            predicted = [(x, p.predicted) for x, p in zip(xs, s.block_cost) if p.predicted is not None]
            if predicted:
                (line,) = ax.plot([x for x, _ in predicted], [y for _, y in predicted], linestyle="--", linewidth=1.2,
                                  color=_COLORS[name], alpha=.6, label=f"{name}: geometry's prediction")
                line.set_gid(f"kv-{name}-predicted")
        ax.set_xlabel("seconds since the request began")
        ax.set_ylabel("KV blocks")
        ax.legend(loc="upper left")
    rows = tuple((name, f"{p.t - s.block_cost[0].t:.2f}", str(p.held), "-" if p.predicted is None else str(p.predicted))
                 for name, s in have for p in s.block_cost)
    return Plot("kv-blocks", "KV blocks held during the block-cost request, with the geometry's prediction",
                _draw("kv-blocks", 1, draw), count, ("side", "s", "blocks held", "predicted"), rows, counted="kv-")


def _requests(sides: Sequence[tuple[str, PassSeries]]) -> Plot | None:
    have = [(name, s) for name, s in sides if s.requests]
    if not have:
        return None
    count = sum(len(s.requests) for _, s in have)

    def draw(axes: list[Axes]) -> None:
        ttft, rate = axes
        for offset, (name, s) in enumerate(have):
            xs = [i + 1 for i in range(len(s.requests))]
            _line(ttft, f"ttft-{name}", xs, [r.ttft_s for r in s.requests], label=name, color=_COLORS[name],
                  linestyle="none", size=4 + offset)
            decoded = [(x, r.decode_tps) for x, r in zip(xs, s.requests) if r.decode_tps is not None]
            if decoded:
                _line(rate, f"decode-{name}", [x for x, _ in decoded], [y for _, y in decoded], label=name,
                      color=_COLORS[name], linestyle="none", size=4 + offset)
        ttft.set_xlabel("request (in the order sent)")
        ttft.set_ylabel("time to first token (s)")
        rate.set_xlabel("request (in the order sent)")
        rate.set_ylabel("decode tokens/s")
        ttft.legend()
    rows = tuple((name, str(i + 1), r.check, f"{r.ttft_s:.3f}", "-" if r.decode_tps is None else f"{r.decode_tps:.1f}",
                  f"{r.prompt_tokens:,}", str(r.completion_tokens)) for name, s in have for i, r in enumerate(s.requests))
    return Plot("requests", "Time to first token and decode rate per request, baseline against candidate",
                _draw("requests", 2, draw), count,
                ("side", "#", "check", "TTFT s", "decode tok/s", "prompt", "completion"), rows, counted="ttft-")


def _parallel(sides: Sequence[tuple[str, PassSeries]]) -> Plot | None:
    have = [(name, s) for name, s in sides if any(s.parallel)]
    if not have:
        return None
    count = sum(len(r) for _, s in have for r in s.parallel)

    def draw(axes: list[Axes]) -> None:
        for ax, (name, s) in zip(axes, have):
            t0 = min(r[0][0] for r in s.parallel if r)
            for i, request in enumerate(s.parallel):
                if request:
                    _line(ax, f"parallel-{name}-{i}", [t - t0 for t, _ in request], [n for _, n in request],
                          label=f"request {i + 1}", color=f"C{i % 10}", size=2)
            for event in (e for e in s.preemptions if e.check == "parallel"):
                ax.axvline(event.t - t0, color="#d62728", linestyle=":", linewidth=1.2)
            ax.set_title(f"{name}" + (f": {sum(e.count for e in s.preemptions if e.check == 'parallel')} preemption(s) "
                                      "(dotted)" if any(e.check == "parallel" for e in s.preemptions) else ""))
            ax.set_xlabel("seconds since the parallel check began")
            ax.set_ylabel("streamed events (one per token or more)")
            ax.legend(loc="upper left", fontsize=7)
    rows: list[tuple[str, ...]] = []
    for name, s in have:
        t0 = min(r[0][0] for r in s.parallel if r)
        for i, request in enumerate(s.parallel):
            if request:
                rows.append((name, str(i + 1), f"{request[0][0] - t0:.2f}", f"{request[-1][0] - t0:.2f}", str(request[-1][1])))
        rows += [(name, "preemption", f"{e.t - t0:.2f}", "", e.what) for e in s.preemptions if e.check == "parallel"]
    return Plot("parallel", "The parallel check: each request's progress, preemptions marked",
                _draw("parallel", len(have), draw), count, ("side", "request", "first s", "last s", "tokens"), tuple(rows))


def _memory(sides: Sequence[tuple[str, PassSeries]]) -> Plot | None:
    have = [(name, s) for name, s in sides if s.memory]
    if not have:
        return None
    count = sum(len(s.memory) for _, s in have)

    def draw(axes: list[Axes]) -> None:
        ax = axes[0]
        floor = next((s.memory_floor_mib for _, s in have if s.memory_floor_mib is not None), None)
        for name, s in have:
            for i, device in enumerate(sorted({m.device for m in s.memory})):
                points = [m for m in s.memory if m.device == device]
                _line(ax, f"memory-{name}-{device}", [m.t for m in points], [m.free_mib for m in points],
                      label=f"{name}: {device}", color=_COLORS[name] if i == 0 else f"C{i + 2}", size=2)
            low = s.lowest_memory()
            if low is not None:
                ax.annotate(f"lowest {low.free_mib:,.0f} MiB", (low.t, low.free_mib), fontsize=7,
                            xytext=(-90, -12), textcoords="offset points", color=_COLORS[name])
        if floor is not None:
            ax.axhline(floor, color="#d62728", linestyle="--", linewidth=1.2, label=f"floor {floor:,.0f} MiB")
        ax.set_xlabel("seconds since the checks began")
        ax.set_ylabel("free memory (MiB)")
        ax.legend(loc="lower left", fontsize=7)
    rows = tuple((name, f"{m.t:.2f}", m.device, f"{m.free_mib:,.0f}", f"{m.total_mib:,.0f}", m.check)
                 for name, s in have for m in s.memory)
    lows = "; ".join(f"{name} lowest {low.free_mib:,.0f} MiB free on {low.device} at {low.t:.1f}s"
                     for name, s in have if (low := s.lowest_memory()) is not None)
    return Plot("memory", f"Free memory over time, with the floor ({lows})", _draw("memory", 1, draw), count,
                ("side", "s", "device", "free MiB", "of MiB", "check"), rows)


def _throughput(sides: Sequence[tuple[str, PassSeries]]) -> Plot | None:
    have = [(name, s) for name, s in sides if s.throughput]
    if not have:
        return None
    count = sum(len(s.throughput) for _, s in have)

    def draw(axes: list[Axes]) -> None:
        ax = axes[0]
        for name, s in have:
            _line(ax, f"throughput-{name}", [t for t, _ in s.throughput], [v for _, v in s.throughput], label=name,
                  color=_COLORS[name], size=2)
            for stall in s.stalls:
                ax.axvline(stall.t, color="#d62728", linestyle=":", linewidth=1.2)
        ax.set_xlabel("seconds since the checks began")
        ax.set_ylabel("engine tokens/s")
        ax.legend(loc="upper right")
    rows: list[tuple[str, ...]] = [(name, f"{t:.2f}", f"{v:,.1f}", "") for name, s in have for t, v in s.throughput]
    rows += [(name, f"{e.t:.2f}", "stall", f"{e.check}: {e.what}") for name, s in have for e in s.stalls]
    stalls = sum(len(s.stalls) for _, s in have)
    return Plot("throughput", f"Engine tokens per second over the check run ({stalls} stall(s) the watchdog saw, dotted)",
                _draw("throughput", 1, draw), count, ("side", "s", "tokens/s", "stall"), tuple(rows))

