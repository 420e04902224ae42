"""The rule for "real", the verdict and memory per check phase, on figures written by hand (the server test,
tests/deploy/test_deploy_report_server.py, runs them on the real CPU server)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from vpatch.deploy import Figures, PassSeries, Side
from vpatch.deploy.judge import CheckResult, CheckStatus
from vpatch.deploy.ledger import parse_start_log
from vpatch.deploy.measure import cpu_stall_us
from vpatch.deploy.noise import FLOOR_S, Call, chance, compare, load_moved, stall_moved
from vpatch.deploy.series import MemoryPoint
from vpatch.report import deploy_verdict


def test_overlapping_ranges_are_within_noise_and_apart_ranges_are_real() -> None:
    same = compare([0.79, 0.81, 0.80, 0.95, 0.78], [0.80, 0.82, 0.77, 0.90, 0.83], higher_is_better=False, min_change=0.1)
    assert same[0] is Call.NOISE and "ranges overlap" in same[1]
    faster = compare([1.20, 1.25, 1.23, 1.30, 1.22], [0.79, 0.80, 0.78, 0.82, 0.81], higher_is_better=False, min_change=0.1)
    assert faster[0] is Call.BETTER and "-35%" in faster[1]
    decode = compare([94.3, 95.0, 93.8], [138.9, 137.2, 139.5], higher_is_better=True, min_change=0.1)
    assert decode[0] is Call.BETTER
    slower = compare([15.1, 15.0, 15.2], [15.7, 15.6, 15.8], higher_is_better=False, min_change=0.1)
    assert slower[0] is Call.NOISE and "under 10%" in slower[1]  # 0.6 s on 15: apart, but small
    assert compare([1.0], [2.0], higher_is_better=False, min_change=0.1)[0] is Call.UNJUDGED  # one run: no rule
    assert compare(None, [2.0, 2.1, 2.2], higher_is_better=False, min_change=0.1)[0] is Call.UNJUDGED
    assert round(1 / chance(5, 5)) == 126 and round(1 / chance(3, 3)) == 10


def test_times_under_the_floor_are_within_noise_and_above_it_are_judged() -> None:
    """The same image measured twice in the suite's cold run (2-core machine, load ~4): its time to first token
    0.04 s median one pass and 0.01 s the next, both ranges tight: apart, -75%, yet 30 ms. A time's medians must
    differ by FLOOR_S too; the same shape at seconds is still called."""
    jitter = compare([0.04, 0.03, 0.10, 0.04, 0.04], [0.01, 0.01, 0.02, 0.01, 0.01], higher_is_better=False,
                     min_change=0.1, floor=FLOOR_S)
    assert jitter[0] is Call.NOISE and "30 ms apart, under 50 ms" in jitter[1], jitter
    seconds = compare([4.0, 3.0, 10.0, 4.0, 4.0], [1.0, 1.0, 2.0, 1.0, 1.0], higher_is_better=False,
                      min_change=0.1, floor=FLOOR_S)
    assert seconds[0] is Call.BETTER, seconds
    # a rate has no floor: the same samples as tokens per second are judged on the relative rule alone
    rate = compare([0.04, 0.03, 0.10, 0.04, 0.04], [0.01, 0.01, 0.02, 0.01, 0.01], higher_is_better=True,
                   min_change=0.1)
    assert rate[0] is Call.WORSE, rate


def test_a_difference_measured_under_another_load_is_not_judged() -> None:
    """The same image, its candidate side measured while the host's load went from 5 to 24 (seen on the 2-core
    test machine): ranges apart, but no call of better or worse."""
    moved = load_moved((5.3, 5.1), (12.7, 23.7))
    assert moved == "the host's load average moved from 5.3 to 23.7 between the sides"
    call, why = compare([0.01, 0.01, 0.02, 0.01, 0.01], [0.05, 0.12, 1.04, 0.09, 0.2], higher_is_better=False,
                        min_change=0.1, load=moved)
    assert call is Call.UNJUDGED and "measure again at a steady load" in why
    assert load_moved((4.0, 4.5), (5.2, 5.9)) is None  # 4.5 -> 5.9: under 1.5x, the same kind of load
    assert load_moved((0.2, 0.3), (0.9, 1.1)) is None  # under one process more: an idle machine's jitter


def test_a_difference_measured_while_the_cpu_stall_share_moved_is_not_judged() -> None:
    """A CI run's baseline ran beside another test's busy phase (its parallel makespan up to 1.19 s, the
    candidate's 0.11 s at most) while the one-minute load average kept within the load rules: one figure was called
    better (the report cut off which). Samples of that shape, by hand: the kernel's stall count over exactly each
    side's repeats tells the sides apart."""
    moved = stall_moved(0.62, 0.18)
    assert moved == "the share of time some task on the host waited for a CPU moved from 62% to 18% between the sides"
    base = Figures(prefill_samples=(0.31, 1.19, 0.4, 0.5, 0.35), timing_load=(3.1, 3.3), timing_cores=2,
                   timing_stall=0.62)
    cand = Figures(prefill_samples=(0.07, 0.06, 0.11, 0.07, 0.08), timing_load=(3.4, 3.2), timing_cores=2,
                   timing_stall=0.18)
    assert deploy_verdict.sides_moved(base, cand) == moved
    (row,) = [r for r in deploy_verdict.timing_rows(base, cand) if r.label == "long prefill"]
    assert row.call is Call.UNJUDGED and moved in row.why, row
    # the same samples with the stall alike (the tiny server's own, 17-19% in three quiet runs): called
    steady = deploy_verdict.timing_rows(base, replace(cand, timing_stall=0.6))
    assert [r.call for r in steady if r.label == "long prefill"] == [Call.BETTER]
    assert stall_moved(0.19, 0.17) is None and stall_moved(None, 0.9) is None  # an older record: no stall count


def test_a_difference_measured_on_a_saturated_host_is_not_judged_however_alike_the_sides() -> None:
    """The same image against itself beside two busy loops on two cores (load 3.7 on both sides, under the busy
    rule): stall shares 93% and 96%, time to first token 0.01 s against 0.08 s, both ranges tight, called worse.
    Samples of that shape: not judged, and the reason names both shares; under the threshold, the same samples are
    called as before."""
    base = Figures(ttft_samples=(0.01, 0.01, 0.04, 0.01, 0.01), timing_load=(3.72, 3.72), timing_cores=2,
                   timing_stall=0.925)
    cand = Figures(ttft_samples=(0.08, 0.07, 0.09, 0.08, 0.08), timing_load=(3.69, 3.69), timing_cores=2,
                   timing_stall=0.959)
    why = stall_moved(0.925, 0.959)
    assert why is not None and "92%" in why and "96%" in why and "saturated" in why
    assert deploy_verdict.sides_moved(base, cand) == why
    (row,) = [r for r in deploy_verdict.timing_rows(base, cand) if r.label == "time to first token"]
    assert row.call is Call.UNJUDGED, row
    calm = deploy_verdict.timing_rows(replace(base, timing_stall=0.18), replace(cand, timing_stall=0.19))
    assert [r.call for r in calm if r.label == "time to first token"] == [Call.WORSE]


def test_the_stall_share_reads_the_kernel_s_count_of_tasks_waiting_for_a_cpu() -> None:
    """Twice as many busy processes as cores for a second and a half: a task waits for a CPU nearly all the time
    (three on the 2-core test machine: 50%; none: 0%). Read from the real kernel, never written by hand."""
    if not Path("/proc/pressure/cpu").exists():
        assert cpu_stall_us() is None  # a kernel without pressure stall information: no count, never a zero
        return
    spin = "import time\nend = time.monotonic() + 2.5\nwhile time.monotonic() < end:\n    pass\n"
    busy = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2 * (os.cpu_count() or 1))]
    try:
        time.sleep(0.5)
        before, began = cpu_stall_us(), time.monotonic()
        time.sleep(1.5)
        after, took = cpu_stall_us(), time.monotonic() - began
    finally:
        for b in busy:
            b.wait()
    assert before is not None and after is not None
    assert (after - before) / 1e6 / took > 0.4, (before, after, took)


def test_a_difference_measured_on_a_host_busier_than_twice_its_cores_is_not_judged() -> None:
    """The same image on the 2-core test machine, both sides at a load within 1.5x of each other but over 2 per
    core (a shuffled suite beside two busy loops): its time to first token 0.12 s median at load 6.5, 0.01 s at
    5.0, ranges apart. The scheduler's times, not the build's: not judged; the same loads on 4 cores are."""
    busy = load_moved((6.08, 6.48), (5.03, 5.03), 2)
    assert busy == ("the host's load average reached 6.5 on 2 cores during the baseline's repeats (over 2 runnable "
                    "processes per core: the times are the scheduler's)")
    call, why = compare([0.12, 0.10, 0.18, 0.11, 0.13], [0.01, 0.01, 0.02, 0.01, 0.01], higher_is_better=False,
                        min_change=0.1, load=busy, floor=FLOOR_S)
    assert call is Call.UNJUDGED and "reached 6.5 on 2 cores" in why, why
    assert compare([0.12, 0.10, 0.18, 0.11, 0.13], [0.01, 0.01, 0.02, 0.01, 0.01], higher_is_better=False,
                   min_change=0.1, floor=FLOOR_S)[0] is Call.BETTER  # the same samples, the load not known
    assert load_moved((6.08, 6.48), (5.03, 5.03), 4) is None  # 1.6 per core: judged
    assert load_moved((6.08, 6.48), (5.03, 5.03)) is None  # an older record, its cores not known: the old rule
    assert "during the candidate's repeats" in (load_moved((3.0, 3.2), (3.3, 4.5), 2) or "")  # 4.5 on 2 cores


def test_a_decode_rate_read_in_bursts_on_both_sides_stays_a_row_that_says_why() -> None:
    """A shuffled suite at load ~5 on 2 cores: every one of the five short timing answers of both sides came in
    one read, so neither side kept a decode rate. The row is shown as not measured with that reason, on the
    console, in --json and on the page, never dropped without a word."""
    base = Figures(ttft_samples=(0.05, 0.04, 0.06, 0.05, 0.05), decode_bursts=5, timing_min_change=0.1)
    cand = Figures(ttft_samples=(0.04, 0.05, 0.05, 0.06, 0.04), decode_bursts=5, timing_min_change=0.1)
    rows = {r.label: r for r in deploy_verdict.timing_rows(base, cand)}
    decode = rows["decode rate"]
    assert (decode.baseline, decode.candidate, decode.call) == ("-", "-", Call.UNJUDGED)
    assert decode.why.startswith("not measured: the baseline's 5 of 5 answers came in bursts (under half the gaps "
                                 "between tokens over 0.1 ms: a loaded host; measure again at a steady load) and the "
                                 "candidate's 5 of 5 answers came in bursts"), decode.why
    assert decode.why.endswith(", which give no decode rate"), decode.why
    found = deploy_verdict.compare_sides(side(base), side(cand))
    assert any(u.startswith("decode rate (not measured: the baseline's") for u in found.unjudged), found.unjudged
    doc = deploy_verdict.to_json(side(base), side(cand))
    assert [f["call"] for f in doc["timing"]["figures"] if f["figure"] == "decode rate"] == ["not judged"]
    # one side kept two rates, the other none: unjudged by the rule, and the bursts named beside it
    some = deploy_verdict.timing_rows(Figures(ttft_samples=(0.05,) * 5, decode_samples=(900.0, 950.0), decode_bursts=3),
                                      cand)
    why = next(r.why for r in some if r.label == "decode rate")
    assert why.startswith("measured on one side only; the baseline's 3 of 5 answers came in bursts"), why
    # answers too short to time are a reason of their own
    short = deploy_verdict.timing_rows(None, Figures(ttft_samples=(0.05,) * 5, decode_bursts=1))
    assert [r.why for r in short if r.label == "decode rate"] == [
        "not measured: the candidate's 1 of 5 answers came in bursts (under half the gaps between tokens over 0.1 ms: "
        "a loaded host; measure again at a steady load) and the candidate's 4 of 5 answers were under 16 tokens, too "
        "few to time, which give no decode rate"]
    # a record older than the count (decode_bursts None): nothing to say, so no row, as before
    assert "decode rate" not in {r.label for r in deploy_verdict.timing_rows(None, Figures(ttft_samples=(0.05,) * 5))}


def side(figures: Figures, log: str = "", checks: tuple[CheckResult, ...] = (), memory: tuple[MemoryPoint, ...] = ()) -> Side:
    return Side(checks, figures, PassSeries(memory=memory), ledger=parse_start_log(log))


LOG = ("(Worker_TP{i} pid=1) INFO 09-24 20:01:02 [x.py:1] Loading weights took {load} seconds\n"
       "(Worker_TP{i} pid=1) INFO 09-24 20:01:02 [x.py:1] Model loading took 14.2 GiB memory and 108.5 seconds\n"
       "(Worker_TP{i} pid=1) INFO 09-24 20:01:02 [x.py:1] Free memory on device (31.36/31.36 GiB) on startup. Desired "
       "GPU memory utilization is (0.9, 28.22 GiB). Actual usage is {consumed} GiB for consumed memory (weights + "
       "non-torch), 2.1 GiB for peak activation, and 0.5 GiB for CUDAGraph memory. Replace …\n")


def cards(load: float, consumed: float) -> str:
    return "".join(LOG.format(i=i, load=load, consumed=consumed) for i in range(4))


def test_the_verdict_names_better_worse_noise_and_what_stands_beside_a_failure() -> None:
    base = side(Figures(kv_pool_tokens=1_041_901, ttft_samples=(1.23, 1.25, 1.22), decode_samples=(94.3, 95.0, 93.8),
                        prefill_samples=(15.1, 15.0, 15.2), timing_min_change=0.1), cards(107.0, 15.3),
                memory=(MemoryPoint(1.0, "gpu0", 30000, 32607, "parallel"),))
    failed = CheckResult("memory", CheckStatus.FAIL, "lowest 200 MiB free", "gpu0 went below the floor")
    cand = side(Figures(kv_pool_tokens=1_064_800, ttft_samples=(0.79, 0.80, 0.78), decode_samples=(138.9, 137.2, 139.5),
                        prefill_samples=(15.7, 15.6, 15.8), timing_min_change=0.1), cards(151.0, 16.4), (failed,),
                memory=(MemoryPoint(1.0, "gpu0", 31400, 32607, "parallel"),))
    found = deploy_verdict.compare_sides(base, cand)
    assert any(b.startswith("KV pool (tokens) 1,041,901 -> 1,064,800") for b in found.better)
    assert any(b.startswith("time to first token") for b in found.better)
    assert any(b.startswith("decode rate") for b in found.better)
    assert any(n.startswith("long prefill") for n in found.noise)
    assert "start: weights load +44.00 s per worker (one start each)" in found.worse
    assert "start: non-torch memory (consumed - weights) +1.10 GiB per worker" in found.worse
    assert found.failed == "memory: lowest 200 MiB free (gpu0 went below the floor)"
    # Beside a memory failure: the memory lines of the ledger first, then the phase table's difference.
    assert found.explained_by[0] == "start: consumed (weights + non-torch) +1.10 GiB per worker"
    assert "parallel: gpu0 peak +1,400 MiB (30,000 -> 31,400; lowest free 1,207 MiB)" in found.explained_by
    rows = deploy_verdict.ledger_table_rows(base, cand)
    assert ("weights load", "107.00 s x4 workers", "151.00 s x4 workers", "weights load +44.00 s per worker") in rows
    doc = deploy_verdict.to_json(base, cand)
    assert doc["verdict"]["failed"] and doc["timing"]["rule"].startswith("A timing difference is called real only")
    assert {t["call"] for t in doc["timing"]["figures"]} == {"better", "within noise"}


def test_memory_per_phase_takes_the_peak_and_the_lowest_free_per_device() -> None:
    points = (MemoryPoint(0.5, "container", 900, 2000, "kv pool"), MemoryPoint(1.0, "container", 1000, 2000, "parallel"),
              MemoryPoint(1.5, "container", 1700, 2000, "parallel"), MemoryPoint(2.0, "container", 1100, 2000, "parallel"))
    rows = deploy_verdict.memory_phases(PassSeries(memory=points), "candidate")
    assert [(r.check, r.peak_used_mib, r.lowest_free_mib, r.readings) for r in rows] == [
        ("kv pool", 900, 1100, 1), ("parallel", 1700, 300, 3)]


def test_a_phase_difference_names_the_resident_part_where_page_cache_moved_the_figure() -> None:
    """A container on cgroup v1: the candidate held 400 MiB more of its own, and docker's figure read 575 MiB more
    because the cache of files it read first counts against it (a shuffled run of the server test)."""
    base = side(Figures(), memory=(MemoryPoint(1.0, "container", 1300, 24000, "kv pool", 1100),))
    cand = side(Figures(), memory=(MemoryPoint(1.0, "container", 1875, 24000, "kv pool", 1502),
                                   MemoryPoint(1.5, "container", 1800, 24000, "kv pool", 1500)))
    assert deploy_verdict.phase_differences(base, cand) == [
        "kv pool: container peak +575 MiB (1,300 -> 1,875; lowest free 22,125 MiB; resident +402 MiB, the rest page cache)"]
    doc = deploy_verdict.to_json(base, cand)
    assert [p["peak_resident_mib"] for p in doc["memory_phases"]] == [1100, 1502]
    # the same movement in both: nothing more to say; a GPU (no resident figure): as before
    same = side(Figures(), memory=(MemoryPoint(1.0, "container", 1700, 24000, "kv pool", 1495),))
    assert deploy_verdict.phase_differences(base, same)[0].endswith("lowest free 22,300 MiB)")
    gpu = side(Figures(), memory=(MemoryPoint(1.0, "gpu0", 31400, 32607, "parallel"),))
    assert deploy_verdict.phase_differences(side(Figures(), memory=(MemoryPoint(1.0, "gpu0", 30000, 32607, "parallel"),)),
                                            gpu) == ["parallel: gpu0 peak +1,400 MiB (30,000 -> 31,400; lowest free 1,207 MiB)"]
    again = PassSeries.from_json(cand.series.to_json())
    assert again.memory == cand.series.memory and again.memory[0].resident_mib == 1502


def test_the_page_puts_the_verdict_on_top_and_shows_ledger_rule_and_phases() -> None:
    from vpatch.deploy import DeployRecord
    from vpatch.report import deploy_html

    base = side(Figures(ttft_samples=(1.23, 1.25, 1.22), timing_min_change=0.1), cards(107.0, 15.3),
                memory=(MemoryPoint(1.0, "gpu0", 30000, 32607, "parallel"),))
    failed = CheckResult("memory", CheckStatus.FAIL, "lowest 200 MiB free", "gpu0 went below the floor")
    cand = side(Figures(ttft_samples=(0.79, 0.80, 0.78), timing_min_change=0.1), cards(151.0, 16.4), (failed,),
                memory=(MemoryPoint(1.0, "gpu0", 31400, 32607, "parallel"),))
    record = DeployRecord("flash-next", "vllm-flash-next", "nightly", "20260924-200000", "k", base, cand,
                          decision="rolled back", failed_check="memory")
    page = deploy_html.render(record)
    assert page.index('id="decision"') < page.index('id="verdict"') < page.index("<h2>Checks</h2>")
    assert page.index("<h2>Checks</h2>") < page.index('id="ledger"') < page.index('id="timing"') < page.index('id="memory-phases"')
    assert "weights load +44.00 s per worker" in page and "A timing difference is called real only" in page
    assert "<b>failed</b> memory: lowest 200 MiB free" in page


def test_memory_held_more_in_every_phase_is_worse_and_side_by_side() -> None:
    base = side(Figures(), memory=(MemoryPoint(0.5, "container", 1277, 24105, "kv pool"),
                                   MemoryPoint(1.5, "container", 1283, 24105, "parallel")))
    cand = side(Figures(), memory=(MemoryPoint(0.5, "container", 1663, 24105, "kv pool"),
                                   MemoryPoint(1.5, "container", 1684, 24105, "parallel")))
    found = deploy_verdict.compare_sides(base, cand)
    assert found.worse == ["memory: container peak +386 to +401 MiB in 2 of 2 phases (most in parallel: 1,283 -> "
                           "1,684 MiB; lowest free 22,421 MiB)"]
    assert deploy_verdict.phase_table_rows(base, cand)[1] == ("parallel", "container", "1,283", "1,684", "+401",
                                                              "22,421", "24,105")
