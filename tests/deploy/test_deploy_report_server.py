"""The deploy's report, memory check and recorded baseline against the real vLLM CPU server in docker.

On the session's production server (`tiny_production`, tests/helpers/deployhost.py), two deploys, each asserted on
several ways: a passing deploy with a measured baseline (series in --json, the page in headless Chromium);
a second deploy of the same image whose baseline is the first one's record (production's own /metrics show no
request-check request), killed -9 in its checks, with the report rendered from its record. On the bare host beside
it (`tiny_bare`: nothing runs there), a candidate whose container crosses the memory floor under the parallel check
(rolled back by the memory check, the curve in its page). The second needs the first's record: it runs after it
(file order). Three server starts: one per candidate.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import browser
from helpers.deployhost import BLOCK_COST, NAME, SUITE, Host, Spawned, cue_at_parallel, cue_image

from vpatch.config.definition import ImageDefinition
from vpatch.deploy.journal import Phase
from vpatch.deploy.readings import Metrics
from vpatch.deploy.record import DeployRecord, recorded_baseline, suite_key

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]
# VPATCH_KEEP_REPORTS=DIR keeps each deploy's page there (docs/deploy.md's screenshot is made from one).
KEEP = os.environ.get("VPATCH_KEEP_REPORTS")


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
    checks = {**SUITE["checks"], "block_cost": BLOCK_COST, "memory": {"min_free_mib": 64}}
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
    page = Path(shown.removeprefix("report: "))
    assert page.exists() and page == Path(host.env["VPATCH_STATE"]) / "deploy" / "reports" / f"{NAME}-{journal.started}.html"
    plots = assert_page(page, [base, cand], "Deployed:")
    assert set(plots) == {"kv-blocks", "requests", "parallel", "memory", "throughput"}
    keep(page, "deployed.html")
    png = tmp_path / "report.png"
    done = subprocess.run([str(ROOT / "scripts" / "report-screenshot"), str(page), str(png)], capture_output=True,
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
    checks = {**SUITE["checks"], "block_cost": BLOCK_COST, "memory": {"min_free_mib": 64}}
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
    second = host.run("deploy", NAME, "--image", host.image)
    assert second.returncode == 1 and f"another vpatch deploy {NAME} is running (pid {proc.pid})" in second.stderr
    rolling = host.run("deploy", NAME, "--rollback")
    assert rolling.returncode == 1 and "is running" in rolling.stderr
    proc.kill()
    _out, err = proc.communicate()
    assert "baseline: the figures recorded when" in err and "no request goes to production" in err, err
    assert record.baseline.source == "recorded" and record.baseline.recorded_at
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
    limit = used[0] // (1024 * 1024) + HEADROOM_MIB
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
    assert f"floor {FLOOR_MIB} MiB" in memory["figure"] and "(parallel)" in memory["figure"], memory
    # Fail fast: the parallel check was stopped by it, nothing after it ran, the log scan never saw the warning.
    assert names[names.index("memory") + 1] == "parallel" and names[-1] == "parallel" and "log scan" not in names
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
