"""The deploy's report, memory check and recorded baseline against the real vLLM CPU server in docker.

On the session's production server (`tiny_production`, tests/helpers/deployhost.py), two deploys, each asserted on
several ways: a passing deploy with a measured baseline (series in --json, the page in headless Chromium);
a second deploy of the same image whose baseline is the first one's record (production's own /metrics show no
request-check request), killed -9 in its checks, with the report rendered from its record. On the bare host beside
it (`tiny_bare`: nothing runs there), a candidate whose container crosses the memory floor under the parallel check
(rolled back by the memory check, the curve in its page). The second needs the first's record: it runs after it
(file order). Last, on production again, a candidate that holds 400 MiB more and starts 40 s later, deployed against
production measured now and rolled back afterwards: the start ledger and the memory-per-phase table must show both.
Five server starts: one per candidate, and production's own again after the last one's `--rollback`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import browser
from helpers.deployhost import BLOCK_COST, NAME, SUITE, Host, Spawned, cue_at_parallel, cue_image, wrapper_image

from vpatch.config.definition import ImageDefinition
from vpatch.deploy import load_moved, stall_moved
from vpatch.deploy.journal import Phase
from vpatch.deploy.readings import Metrics
from vpatch.deploy.record import DeployRecord, recorded_baseline, suite_key
from vpatch.docker import Docker
from vpatch.report import deploy_verdict

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]
# VPATCH_KEEP_REPORTS=DIR keeps each deploy's page there (docs/deploy.md's screenshot is made from one).
KEEP = os.environ.get("VPATCH_KEEP_REPORTS")
# The timing figures repeated (deploy.checks.timing): short requests (TTFT, decode), a 600-token prefill, two at
# once (the makespan), 5 times a side: about 5 s on the tiny model. In the suite of the first two tests: the same
# image against itself must call every timing difference within noise, and the recorded baseline carries them.
TIMING = {"repeats": 5, "prompt_tokens": 64, "max_tokens": 32, "long_prompt_tokens": 600, "parallel": 2}
REPORT_CHECKS = {**SUITE["checks"], "block_cost": BLOCK_COST, "memory": {"min_free_mib": 64}, "timing": TIMING}


@pytest.fixture
def host(tiny_production: Host) -> Host:
    return tiny_production


def long_requests(host: Host) -> float:
    """Requests production served with a prompt over 100 tokens (vllm:request_prompt_tokens): every request
    check sends one (block cost 800, needles 600, parallel 4 x 600, ceiling 1,008); the container's own
    health check sends "ping", the rollback's liveness a 1-token prompt."""
    return _over_100(host.server.metrics())


def _over_100(metrics: Metrics) -> float:
    count = metrics.total("vllm:request_prompt_tokens_count")
    small = sum(s.value for s in metrics.find("vllm:request_prompt_tokens_bucket") if float(s.labels["le"]) == 100.0)
    assert count is not None, "production's /metrics has no vllm:request_prompt_tokens histogram"
    return count - small


def recorded(host: Host) -> bool:
    """Whether a deploy of images/tiny.yaml's suite, as it is now, is recorded for the image production runs."""
    info = host.docker.container(host.container)
    assert info is not None
    suite = ImageDefinition.load(host.root, NAME).deploy
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VPATCH_STATE", host.env["VPATCH_STATE"])
        return recorded_baseline(NAME, info.image_id, suite_key(suite)) is not None


def snapshot_hook(path: Path, host: Host) -> dict[str, list[list[str]]]:
    """A before_switch hook that saves production's /metrics just before it is parked (afterwards it is stopped)."""
    code = "import sys, urllib.request; open(sys.argv[2], 'w').write(urllib.request.urlopen(sys.argv[1]).read().decode())"
    return {"before_switch": [[sys.executable, "-c", code, f"{host.server.base_url}/metrics", str(path)]]}


def keep(page: Path, name: str) -> None:
    if KEEP:
        Path(KEEP).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(page, Path(KEEP) / name)


def counted(series: dict[str, Any]) -> dict[str, int]:
    """The samples each plot must show, from one side's series in --json."""
    return {"kv-blocks": len(series["block_cost"]), "requests": len(series["requests"]),
            "parallel": sum(len(r) for r in series["parallel"]), "memory": len(series["memory"]),
            "throughput": len(series["throughput"])}


def assert_page(page: Path, sides: list[dict[str, Any]], decision: str) -> dict[str, browser.Plot]:
    """The page in headless Chromium: no console line, the decision line, every plot with one marker per sample."""
    loaded = browser.load(page)
    assert loaded.console == (), loaded.console
    line, plots = browser.plots(loaded.dom)
    assert line.startswith(decision), line
    expected: dict[str, int] = {}
    for side in sides:
        for plot, n in counted(side).items():
            expected[plot] = expected.get(plot, 0) + n
    assert {p for p, n in expected.items() if n} == set(plots), (expected, plots)
    for plot_id, plot in plots.items():
        assert plot.has_svg and plot.has_table, plot_id
        assert plot.samples == expected[plot_id] == plot.markers, (plot_id, plot, expected[plot_id])
    return plots


def test_a_deploy_records_its_series_and_writes_a_report_the_browser_renders(host: Host, tmp_path: Path) -> None:
    """A passing deploy, as an operator runs it (no --json): the side-by-side report on stdout (the README's
    example, printed with pytest -s), both hooks run, production parked; its record (the --json shape of each
    side) holds the series the page plots. (The side-by-side test of test_deploy_switch.py until this round:
    one passing deploy for both.)"""
    browser.chromium()
    checks = REPORT_CHECKS
    shot = tmp_path / "metrics-before-park.txt"
    hooks = snapshot_hook(shot, host)
    hooks["after_switch"] = [["touch", str(shot.with_suffix(".after"))]]
    host.write_yaml(checks=checks, hooks=hooks)
    production = host.production()
    before = long_requests(host)
    # Measured, whatever is recorded: in a shuffled run the recorded-baseline test may have recorded this suite
    # for production's image first, and a recorded baseline sends production no request to compare.
    code, out, err = host.deploy("--image", host.image, "--baseline", "measure")
    assert code == 0 and "decision: deployed" in out, out + err[-3000:]
    for figure in ("KV pool (tokens)", "tokens per KV block held", "time to first token", "decode tokens/s",
                   "questions right", "log findings"):
        assert figure in out
    after = host.production()
    assert after["id"] != production["id"] and after["status"] == "running" and after["restart"] == "unless-stopped"
    parked = host.docker.container(str(production["id"]))
    assert parked is not None and parked.name.startswith(f"{host.container}-parked-")
    assert parked.status == "exited" and parked.restart_policy == "no"  # parked until `deploy --rollback`
    journal = host.journal()
    assert journal is not None and journal.phase is Phase.DEPLOYED
    assert shot.exists() and shot.with_suffix(".after").exists()  # both hooks ran: the gateway's divert and back
    print(out)  # the README's example report comes from here (pytest -s)
    (shown,) = [line for line in out.splitlines() if line.startswith("report: ")]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VPATCH_STATE", host.env["VPATCH_STATE"])
        report = json.loads(DeployRecord.path_for(NAME, journal.started).read_text())
    assert report["decision"] == "deployed"
    # The baseline was measured: production's own counters saw its requests (the
    # control for the recorded-baseline test below).
    assert report["baseline"]["source"] == "measured"
    assert _over_100(Metrics.parse(shot.read_text())) >= before + 7
    cand, base = report["candidate"]["series"], report["baseline"]["series"]
    assert cand["block_geometry"] == [64, 128]  # 8,192 tokens in blocks of 128
    held = [p["held"] for p in cand["block_cost"]]
    # 800 + 32 tokens end in 7 blocks of 128; /metrics is read between steps, and the seventh block, held only
    # for the last decode steps, can fall between two readings (docs/deploy-safety.md): at least 6 were seen.
    assert held and max(held) >= 6
    predicted = [p["predicted"] for p in cand["block_cost"] if p["predicted"] is not None]
    # the tokens stepped by the last reading; 8 when the first request was missed and the longer retry measured
    assert predicted and max(predicted) in (6, 7, 8), cand["block_cost"]
    by_check = [r["check"] for r in cand["requests"]]
    assert by_check.count("parallel") == 4 and {"block cost", "needles", "tool call", "questions", "ceiling"} <= set(by_check)
    assert all(r["ttft_s"] > 0 for r in cand["requests"])
    # Streamed events: one per token, fewer where the server merged tokens of a slow reader into one event.
    assert len(cand["parallel"]) == 4 and all(20 <= r[-1][1] <= 160 for r in cand["parallel"]), cand["parallel"]
    assert [r["completion_tokens"] for r in cand["requests"] if r["check"] == "parallel"] == [160] * 4
    assert cand["memory"] and {m["device"] for m in cand["memory"]} == {"container"}
    assert {m["check"] for m in cand["memory"]} >= {"block cost", "parallel"}
    assert cand["throughput"] and max(v for _, v in cand["throughput"]) > 0
    assert cand["memory_floor_mib"] == 64
    checks_seen = {c["name"]: c["status"] for c in report["candidate"]["checks"]}
    assert checks_seen["memory"] == "pass"
    assert base["requests"] and base["memory"]  # the baseline's own samples, for the side-by-side plots
    # The same image against itself: every repeated timing within noise by the stated rule, and the ledger's
    # memory lines equal (vLLM's own start log of the same build and settings).
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VPATCH_STATE", host.env["VPATCH_STATE"])
        kept = DeployRecord.load(DeployRecord.path_for(NAME, journal.started))
    assert kept is not None and kept.candidate is not None and kept.baseline is not None
    timings = deploy_verdict.timing_rows(kept.baseline.figures, kept.candidate.figures)
    print("\n".join(f"timing: {t.label}: {t.baseline} | {t.candidate} | {t.call.value}: {t.why}" for t in timings))
    assert {t.label for t in timings} == {"time to first token", "decode rate", "long prefill", "parallel makespan"}
    loads = (kept.baseline.figures.timing_load, kept.candidate.figures.timing_load)
    stalls = (kept.baseline.figures.timing_stall, kept.candidate.figures.timing_stall)
    print(f"load average during the repeats: baseline {loads[0]}, candidate {loads[1]}; CPU stall {stalls}")
    # Never better or worse: within noise, or not judged where the host's load moved between the sides (the
    # candidate's repeats ran at load 24 where the baseline's ran at 5 in one run of this test) or its CPU stall
    # share did (a CI run's baseline beside another test's busy phase, the load average alike on both sides).
    assert all(s is None or 0 <= s <= 1 for s in stalls)
    assert (stalls[1] is not None) == Path("/proc/pressure/cpu").exists()
    assert {t.call.value for t in timings} <= {"within noise", "not judged"}, timings
    # "not judged" only for a reason the rule states: the load moved or passed 2 per core (the baseline's TTFT
    # 0.12 s at load 6.5, the candidate's 0.01 s at 5.0 on 2 cores, in a shuffled run beside two busy loops), or
    # a side kept too few samples (decode rates read in one burst are not rates; the full suite at load ~3.6 kept
    # fewer than 3 on one side once), or none at all, with the bursts counted (a shuffled run at load ~5 and a
    # cold CI run at up to 8: every one of both sides' five answers came in one read).
    assert kept.candidate.figures.timing_cores == os.cpu_count()
    moved = deploy_verdict.sides_moved(kept.baseline.figures, kept.candidate.figures)
    assert moved == (load_moved(*loads, kept.candidate.figures.timing_cores) or stall_moved(*stalls))
    for t in timings:
        assert (t.call.value == "within noise" or moved or "no rule can tell" in t.why or "one side only" in t.why
                or t.why.startswith("not measured: ")), t
        if t.baseline == "-" and t.candidate == "-":
            assert t.label == "decode rate" and t.why.startswith("not measured: ") and "in bursts" in t.why, t
            assert kept.candidate.figures.decode_bursts and kept.baseline.figures.decode_bursts, t
    assert len(kept.candidate.figures.ttft_samples or ()) == 5 == len(kept.baseline.figures.ttft_samples or ())
    ledger = {r.field: r for r in deploy_verdict.side_ledger_rows(kept.baseline, kept.candidate)}
    assert ledger["kv_tokens"].baseline == {"EngineCore": 8192.0} == ledger["kv_tokens"].candidate
    assert not ledger["kv_tokens"].difference and not ledger["kv_memory_gib"].difference
    assert "start ledger" in out and "within noise:" in out and "rule: A timing difference is called real" in out
    page = Path(shown.removeprefix("report: "))
    assert page.exists() and page == Path(host.env["VPATCH_STATE"]) / "deploy" / "reports" / f"{NAME}-{journal.started}.html"
    plots = assert_page(page, [base, cand], "Deployed:")
    assert set(plots) == {"kv-blocks", "requests", "parallel", "memory", "throughput"}
    keep(page, "deployed.html")
    png = tmp_path / "report.png"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "report-screenshot"), str(page), str(png)], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0 and png.stat().st_size > 20_000, done.stderr


def test_a_recorded_baseline_spares_production_and_a_kill_9_in_the_checks_leaves_the_record(host: Host,
                                                                                              tmp_path: Path) -> None:
    """Production runs the image the first test deployed, with the same suite: its record is the baseline,
    no request check goes to production (its counters, saved by the before_switch hook just before parking,
    did not move). Then kill -9 in the candidate's checks (no handler runs; only the journal and the record
    know): the lock refuses a second deploy and a rollback while the first runs, --status exits 8 (unfinished)
    for monitoring, and the report is rendered from the record. Production then stays the candidate: the
    `--rollback` that starts the parked container again, and a kill -9 in it, are the ceiling test's
    (test_deploy_switch.py), after a successful deploy; here it would cost one more server start."""
    browser.chromium()
    checks = REPORT_CHECKS
    shot = tmp_path / "metrics-before-park.txt"
    host.write_yaml(checks=checks)
    if not recorded(host):
        # Run before the first test (a shuffled run): nothing recorded yet for production's image with this
        # suite. A passing deploy of it records one, as the first test's does: one server start more.
        print("\n[no deploy of this suite recorded for production's image yet: deployed once first]")
        code, out, err = host.deploy("--image", host.image, "--baseline", "none")
        assert code == 0 and recorded(host), out + err[-3000:]
        host.ensure()  # the parked container and the journal removed, as a test finds them
    host.write_yaml(checks=checks, hooks=snapshot_hook(shot, host))
    production = host.production()
    before = long_requests(host)
    proc = host.spawn("--image", host.image)
    record = None
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:  # until this deploy's record holds the candidate's block-cost check
        journal = host.journal()  # Host.ensure() removed the journal of the deploys before: this one's
        if journal is not None:
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("VPATCH_STATE", host.env["VPATCH_STATE"])
                record = DeployRecord.load(DeployRecord.path_for(NAME, journal.started))
            if record is not None and record.candidate and any(c.name == "block cost" for c in record.candidate.checks):
                break
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.3)
    assert record is not None and record.baseline is not None and record.candidate is not None
    (cost,) = [c for c in record.candidate.checks if c.name == "block cost"]
    # A block-cost miss four times over (a machine loaded far past CI's) fails the deploy, and the kill below
    # would land in its rollback: say so rather than fail on the page's wording.
    assert not cost.failed, f"the candidate's block-cost check did not pass, the deploy is rolling back: {cost}"
    # Held where it is, in its checks (a stopped process keeps its lock): at load ~10 the checks left ended
    # before the two refusals below had started (seen once in a shuffled run beside two busy loops).
    os.kill(proc.pid, signal.SIGSTOP)
    second = host.run("deploy", NAME, "--image", host.image)
    assert second.returncode == 1 and f"another vpatch deploy {NAME} is running (pid {proc.pid})" in second.stderr
    rolling = host.run("deploy", NAME, "--rollback")
    assert rolling.returncode == 1 and "is running" in rolling.stderr
    proc.kill()
    _out, err = proc.communicate()
    assert "baseline: the figures recorded when" in err and "no request goes to production" in err, err
    assert record.baseline.source == "recorded" and record.baseline.recorded_at
    # The recorded baseline carries its repeats: the timing samples measured when production was deployed.
    assert len(record.baseline.figures.ttft_samples or ()) == TIMING["repeats"]
    assert record.baseline.ledger.per_worker("kv_tokens") == {"EngineCore": 8192.0}
    assert _over_100(Metrics.parse(shot.read_text())) == before  # not one request check reached production
    status = host.run("deploy", NAME, "--status")
    assert status.returncode == 8 and "checking" in status.stdout and "unfinished" in status.stdout, status.stdout
    assert host.production()["id"] != production["id"]  # the candidate holds the name; production is parked
    page = tmp_path / "killed.html"
    shown = host.run("deploy", NAME, "--report", "--out", str(page))
    assert shown.returncode == 0 and shown.stdout.strip() == f"report: {page}", shown.stderr
    text = page.read_text()
    assert "Unfinished: the deploy of" in text and "stopped during checking" in text, text[:2000]
    assert "Baseline: the figures recorded when the running image was deployed" in text and " ago)" in text
    loaded = browser.load(page)
    assert loaded.console == ()
    _line, plots = browser.plots(loaded.dom)
    assert plots["kv-blocks"].markers == plots["kv-blocks"].samples > 0  # the candidate's block cost, kept
    keep(page, "killed.html")
    # What the kill left: the candidate holds the name, its restart policy still "no" (it never passed), the old
    # production parked, the journal in "checking" (Host.ensure() tidies up for the next test).
    candidate = host.docker.container(host.container)
    parked = host.left_behind("parked")
    assert candidate is not None and candidate.status == "running" and candidate.restart_policy == "no"
    assert len(parked) == 1 and host.docker.container(parked[0]).id == production["id"]  # type: ignore[union-attr]
    journal = host.journal()
    assert journal is not None and journal.phase is Phase.CHECKING and journal.parked_id == production["id"]


# A candidate that needs more working memory under parallel load than its container has to spare (the
# nightly of the two-builds write-up, on a CPU container): the cue image (tests/helpers/deployhost.py), cued as the
# parallel check begins, allocates HOG_MIB and writes to every page of it, then, 30 s later, prints the warning the
# write-up saw. The memory check must fail the deploy before that line is written.
HOG_MIB = 700
FLOOR_MIB = 400
HEADROOM_MIB = 900  # the limit: production's usage now plus this; the hog leaves ~200 MiB, under the floor


def test_a_candidate_crossing_the_memory_floor_is_rolled_back_before_its_allocation_warning(
        tiny_bare: Host, tiny_production: Host) -> None:
    """On the bare host (one server start); the container's limit is sized from the session's production, a
    server of the same configuration."""
    browser.chromium()
    used = tiny_production.docker.container_memory(tiny_production.container)
    assert used is not None
    limit = used.used // (1024 * 1024) + HEADROOM_MIB
    host = tiny_bare
    # The parallel check decodes 400 tokens (1,000 with the prompt), not 160: at load ~4 its four requests took
    # 1.7 s, little for the cue, the 700 MiB written and a memory reading (docker's stats) to fit in.
    checks = {**SUITE["checks"], "memory": {"min_free_mib": FLOOR_MIB},
              "parallel": {**SUITE["checks"]["parallel"], "max_tokens": 400}}
    env = {"VLLM_LOGGING_LEVEL": "INFO", "VPATCH_TEST_HOG_MIB": str(HOG_MIB), "VPATCH_TEST_WARN_AFTER_S": "30"}
    host.write_yaml(checks=checks, memory=f"{limit}m", env=env)
    run = Spawned(host.spawn("--image", cue_image(host.docker, host.image), "--json", "--baseline", "none"))
    cue_at_parallel(host, run)
    code, out, err = run.finish()
    assert out, err[:3000]
    report = json.loads(out)
    if not (code == 6 and report["failed_check"] == "memory"):  # the wrapper's own lines say whether it triggered
        logs = [host.docker.container_logs(name)[-3000:] for name in [host.container, *host.kept_candidates()]]
        raise AssertionError(f"exit {code}, failed check {report['failed_check']}:\n{err}\nthe candidate's log:\n"
                             + "\n".join(logs))
    assert report["baseline"] is None
    names = [c["name"] for c in report["candidate"]["checks"]]
    memory = next(c for c in report["candidate"]["checks"] if c["name"] == "memory")
    assert "container down to" in memory["detail"] or "below the floor" in memory["detail"], memory
    # The 700 MiB are written from the cue at the start of the parallel check; a reading is taken by the check that
    # runs when it begins (docker's stats take a while). Where the four answers came before the hog was resident, the
    # first reading below the floor began in the check after it (a CI run at load ~4: "at 5.0s (ceiling)").
    seen = next((c for c in ("parallel", "ceiling") if f"({c})" in memory["figure"]), None)
    assert seen is not None and f"floor {FLOOR_MIB} MiB" in memory["figure"], memory
    # Fail fast: the check it was seen in was stopped by it, nothing after it ran, the log scan never saw the warning.
    assert names[names.index("memory") + 1] == seen and names[-1] == seen and "log scan" not in names, names
    assert names.index("parallel") <= names.index(seen)
    series = report["candidate"]["series"]
    assert min(m["total_mib"] - m["used_mib"] for m in series["memory"]) < FLOOR_MIB < \
        max(m["total_mib"] - m["used_mib"] for m in series["memory"])
    assert all(abs(m["total_mib"] - limit) < 1 for m in series["memory"])  # against the container's limit
    kept = host.kept_candidates()
    assert len(kept) == 1
    log = host.docker.container_logs(kept[0])
    assert "holding 700 MiB more" in log and "memory allocation failed" not in log, log[-2000:]
    page = Path(report["report"])
    assert f"report: {page}" in err  # --json: the page's path on stderr, stdout stays JSON
    assert_page(page, [series], "Rolled back: the memory check failed")
    keep(page, "memory-rolled-back.html")
    host.assert_first_deploy_rolled_back()


# A candidate that differs from production by known amounts: its wrapper entrypoint (PID 1) holds HOLD_MIB (every
# page written) and waits DELAY_S before it starts vLLM, so the whole start is DELAY_S later and the container holds
# HOLD_MIB more through every check. The CPU server writes no start-log line that sees memory outside vLLM's
# process (its KV line is "Explicitly set (…) GiB for KV cache"): the difference shows in the phase table.
HOLD_MIB = 400
DELAY_S = 40
SLOW = r'''
import os, signal, subprocess, sys, time
hold = bytearray(int(os.environ["VPATCH_TEST_HOLD_MIB"]) * 1024 * 1024)
hold[::4096] = b"\x01" * len(range(0, len(hold), 4096))  # resident: every page written
print(f"[vpatch test image] holding {len(hold) >> 20} MiB, starting vLLM in {os.environ['VPATCH_TEST_DELAY_S']} s", flush=True)
time.sleep(float(os.environ["VPATCH_TEST_DELAY_S"]))
child = subprocess.Popen(sys.argv[1:])
signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signum))
sys.exit(child.wait())
'''


def slow_image(docker: Docker, base: str) -> str:
    """The server image `base` behind the SLOW wrapper."""
    return wrapper_image(docker, base, "slow", SLOW)


def _stamp_seconds(log: str, started_at: str) -> float:
    """Seconds from the container's start to vLLM's "Starting vLLM server on" stamp, computed here on its own."""
    import re
    from datetime import datetime

    (stamp,) = [re.search(r"INFO (\d\d-\d\d \d\d:\d\d:\d\d) ", line)[1]  # type: ignore[index]
                for line in log.splitlines() if "Starting vLLM server on" in line]
    start = datetime.fromisoformat(started_at[:19])
    return (datetime.strptime(f"{start.year}-{stamp}", "%Y-%m-%d %H:%M:%S") - start).total_seconds()


def test_a_candidate_that_holds_more_and_starts_later_shows_both_in_the_ledger_and_the_phase_table(
        host: Host, tmp_path: Path) -> None:
    """Two server starts: the slow candidate, deployed against production measured now, then `--rollback`
    brings production back (as the next test expects to find it)."""
    browser.chromium()
    checks = {**SUITE["checks"], "memory": {"min_free_mib": 64}}
    host.write_yaml(checks=checks, env={"VPATCH_TEST_HOLD_MIB": str(HOLD_MIB), "VPATCH_TEST_DELAY_S": str(DELAY_S)})
    production = host.production()
    code, out, err = host.deploy("--image", slow_image(host.docker, host.image), "--baseline", "measure", "--json")
    assert code == 0, out[-3000:] + err[-3000:]
    report = json.loads(out)
    rows = {r["field"]: r for r in report["ledger"]}
    base_serving, cand_serving = rows["serving_s"]["baseline"]["server"], rows["serving_s"]["candidate"]["server"]
    # The ledger's figure is the candidate's own log stamp against its container's start.
    info = host.docker.container(host.container)
    assert info is not None
    assert abs(cand_serving - _stamp_seconds(host.docker.container_logs(host.container), info.started_at)) <= 1
    first = rows["first_line_s"]
    print(f"\nserving after: production {base_serving:.0f} s, slow candidate {cand_serving:.0f} s; "
          f"named: {rows['serving_s']['difference']}; vLLM's first line after: production "
          f"{first['baseline']['server']:.0f} s, slow candidate {first['candidate']['server']:.0f} s; "
          f"named: {first['difference']}")
    # The wrapper's 40 s stand before vLLM's first stamped line. vLLM's own start is one start a side and moves
    # with the machine's load (production's took 137 s, then 149 s; the candidate's own part 115-141 s at load
    # 14-22 on 2 cores), so the whole serving time is shown, not bounded here.
    assert first["candidate"]["server"] >= DELAY_S and first["candidate"]["server"] > first["baseline"]["server"]
    assert first["difference"].startswith("vLLM's first line after (container start to its first stamped line) +")
    assert rows["serving_s"]["difference"].startswith("serving after (container start to 'Starting vLLM server') ")
    assert rows["healthy_s"]["candidate"]["server"] >= DELAY_S and rows["healthy_s"]["baseline"] == {}
    # The phase table: the held memory through each check, both sides measured in the same phases. The figure is
    # docker's (usage less inactive page cache), and on this cgroup v1 machine a file's cached pages count against
    # the container that read them first: by test order, the candidate read 572-581 MiB over production in every
    # phase of one shuffled run, 640-653 MiB run alone (resident: 398-404 MiB). The processes' own (resident) memory
    # carries the 400 MiB held.
    phases = {(p["side"], p["check"]): p for p in report["memory_phases"]}
    common = [c for side, c in phases if side == "candidate" and ("baseline", c) in phases]
    assert "kv pool" in common
    extra = {c: phases[("candidate", c)]["peak_used_mib"] - phases[("baseline", c)]["peak_used_mib"] for c in common}
    own = {c: phases[("candidate", c)]["peak_resident_mib"] - phases[("baseline", c)]["peak_resident_mib"] for c in common}
    print("memory per phase, candidate - production (MiB):", {c: round(v) for c, v in extra.items()},
          "resident:", {c: round(v) for c, v in own.items()})
    assert HOLD_MIB - 150 <= own["kv pool"] <= HOLD_MIB + 150, own
    named = " | ".join(report["memory_phase_differences"])
    assert "kv pool: container peak +" in named, named
    assert any(w.startswith("memory: container peak +") for w in report["verdict"]["worse"]), report["verdict"]
    assert any(w.startswith("start: serving after") for w in report["verdict"]["worse"]), report["verdict"]
    page = Path(report["report"])
    text = page.read_text()
    assert 'id="verdict"' in text and 'id="ledger"' in text and 'id="memory-phases"' in text
    loaded = browser.load(page)
    assert loaded.console == ()
    keep(page, "slow-candidate.html")
    png = tmp_path / "slow.png"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "report-screenshot"), str(page), str(png)], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    if KEEP:
        shutil.copyfile(png, Path(KEEP) / "slow-candidate.png")
    back = host.run("deploy", NAME, "--rollback")
    assert back.returncode == 0, back.stdout + back.stderr
    assert host.production()["id"] == production["id"]
