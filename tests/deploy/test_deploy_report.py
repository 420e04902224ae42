"""The deploy's recorded data, memory check and HTML report without a server (the real deploys that write
them are in test_deploy_report_server.py)."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest

from vpatch.base.errors import ConfigError
from vpatch.config.definition import ImageDefinition
from vpatch.config.deploy import MemoryCheck, Suite
from vpatch.deploy.client import Server
from vpatch.deploy.judge import CheckResult, CheckStatus, Figures, judge_memory
from vpatch.deploy.memory import DeviceMemory, MemoryWatch, parse_nvidia_smi
from vpatch.deploy.record import DeployRecord, Side, Source, age, recorded_baseline
from vpatch.deploy.series import BlockPoint, MemoryPoint, PassEvent, PassSeries, Recorder, RequestPoint
from vpatch.deploy.watchdog import Aborted, Tick, Watchdog
from vpatch.report import deploy_html

REPO = Path(__file__).resolve().parents[2]
# What nvidia-smi says on the GPU host (4x RTX 5090, 32,607 MiB each) under the four long parallel requests:
# the nightly of the two-builds write-up, ~200 MB (191 MiB) free per card; the patched build, which had about a
# gigabyte more to spare, ~1.2 GB (1,144 MiB). Written from the write-up's figures: no GPU here to take them.
NIGHTLY = "0, 32416, 32607\n1, 32410, 32607\n2, 32416, 32607\n3, 32399, 32607\n"
PATCHED = "0, 31463, 32607\n1, 31470, 32607\n2, 31455, 32607\n3, 31463, 32607\n"


def _series() -> PassSeries:
    return PassSeries(
        block_cost=tuple(BlockPoint(1.0 + i * 0.2, 2 + i * 3, 1 + i) for i in range(6)), block_geometry=(63, 128),
        requests=(RequestPoint("block cost", 2.0, 0.5, 12.0, 3.0, 800, 32), RequestPoint("needles", 4.0, 0.7, None, 1.0, 600, 1)),
        parallel=(((5.0, 0), (5.5, 1), (6.0, 2)), ((5.0, 0), (6.5, 1))),
        preemptions=(PassEvent(5.8, "parallel", "1 preemption(s), 1 in all", 1),),
        throughput=((1.0, 100.0), (1.5, 140.0), (2.0, 0.0)), stalls=(PassEvent(2.0, "ceiling", "no token for 15s"),),
        memory=(MemoryPoint(0.5, "container", 1500, 2048, "kv pool"), MemoryPoint(5.9, "container", 1900, 2048, "parallel")),
        memory_floor_mib=300.0)


def test_series_round_trip_through_json() -> None:
    series = _series()
    again = PassSeries.from_json(series.to_json())
    assert again == series
    assert again.lowest_memory() == MemoryPoint(5.9, "container", 1900, 2048, "parallel")


def test_nvidia_smi_per_card_and_the_flash_next_floor_fails_the_nightly_and_passes_the_patched_build() -> None:
    definition = ImageDefinition.load(REPO, "flash-next")
    check = definition.deploy.memory
    assert check is not None
    for text, expected in ((NIGHTLY, CheckStatus.FAIL), (PATCHED, CheckStatus.PASS)):
        cards = parse_nvidia_smi(text)
        assert [c.device for c in cards] == ["gpu0", "gpu1", "gpu2", "gpu3"]
        points = [MemoryPoint(1.0, c.device, c.used_mib, c.total_mib, "parallel") for c in cards]
        status, figure, _detail = judge_memory(points, check)
        assert status is expected, figure
    status, figure, detail = judge_memory([MemoryPoint(3.5, "gpu3", 32416, 32607, "parallel")], check)
    assert "lowest 191 MiB free of 32,607 MiB on gpu3 at 3.5s (parallel); floor 512 MiB" in figure
    assert "below the floor" in detail
    assert parse_nvidia_smi("0, [N/A], [N/A]\ngarbage\n") == []
    assert judge_memory([], check)[0] is CheckStatus.ERROR  # no reading is no pass


def test_memory_floor_is_read_from_the_suite_and_refused_when_not_positive(tmp_path: Path) -> None:
    def suite(memory: object) -> Suite:
        return Suite.parse({"checks": {"memory": memory}}, root=tmp_path, source="images/x.yaml")

    assert suite({"min_free_mib": 200}).memory == MemoryCheck(200.0)
    for bad in ({"min_free_mib": 0}, {"min_free_mib": "lots"}, {}, {"min_free_mib": 1, "max": 2}):
        with pytest.raises(ConfigError, match=r"deploy\.checks\.memory"):
            suite(bad)


def test_the_memory_watch_keeps_the_first_reading_below_the_floor_and_the_watchdog_aborts_on_it() -> None:
    free = [900.0, 800.0, 150.0, 700.0]
    recorder = Recorder(started=time.monotonic())
    recorder.check = "parallel"
    watch = MemoryWatch(lambda: [DeviceMemory("container", 1000 - free.pop(0), 1000)], recorder, 200.0, every=0.05)
    for _ in range(2):
        watch.sample()
    assert watch.breach is None
    watch.sample()
    assert watch.breach is not None and "container down to 150 MiB free of 1,000 MiB (floor 200 MiB)" in watch.breach
    assert "during parallel" in watch.breach
    watch.sample()
    assert "150 MiB" in watch.breach  # the first crossing is kept
    assert [round(p.free_mib) for p in recorder.freeze().memory] == [900, 800, 150, 700]
    # The watchdog gives up on outstanding requests at once when its abort says so (not at their timeout).
    dog = Watchdog(Server("http://127.0.0.1:9"), stall_s=60)
    dog.abort = lambda: watch.breach
    release = threading.Event()

    def hung(_tick: Tick) -> None:
        release.wait(30)

    began = time.monotonic()
    with pytest.raises(Aborted, match="150 MiB free"):
        dog.call(hung)
    assert time.monotonic() - began < 5
    release.set()


def _record(tmp: Path, started: str, *, decision: str | None, image_id: str, key: str = "k1") -> DeployRecord:
    checks = (CheckResult("kv pool", CheckStatus.PASS, "8,192 tokens (floor 2,048)"),
              CheckResult("memory", CheckStatus.FAIL if decision == "rolled back" else CheckStatus.PASS,
                          "lowest 150 MiB free", "container went below the floor"))
    side = Side(checks, Figures(kv_pool_tokens=8192, ttft_s=0.25), _series(), image_id=image_id)
    return DeployRecord("tiny", "tiny-prod", "img:1", started, key, baseline=None, candidate=side, decision=decision,
                        failed_check="memory" if decision == "rolled back" else None, rollback="production is back",
                        finished="2026-12-01T10:00:00+00:00").save()


def test_a_record_is_found_again_and_is_the_baseline_of_the_same_image_and_suite(tmp_path: Path,
                                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VPATCH_STATE", str(tmp_path))
    old = _record(tmp_path, "20261201-090000", decision="deployed", image_id="sha256:aaa")
    _record(tmp_path, "20261201-100000", decision="rolled back", image_id="sha256:bbb")
    (DeployRecord.folder() / "tiny-2-20261201-110000.json").write_text("{}")  # another definition's: not ours
    assert DeployRecord.load(old.path) == old
    assert [p.name for p in DeployRecord.of("tiny")] == ["tiny-20261201-100000.json", "tiny-20261201-090000.json"]
    assert DeployRecord.latest("tiny") is not None and DeployRecord.latest("tiny").started == "20261201-100000"  # type: ignore[union-attr]
    found = recorded_baseline("tiny", "sha256:aaa", "k1")
    assert found is not None and found.source == Source.RECORDED and found.recorded_at == old.finished
    assert found.figures.kv_pool_tokens == 8192 and found.series == old.candidate.series  # type: ignore[union-attr]
    assert recorded_baseline("tiny", "sha256:bbb", "k1") is None  # rolled back: never production's figures
    assert recorded_baseline("tiny", "sha256:aaa", "other-suite") is None
    assert age("2026-12-01T10:00:00+00:00", now=__import__("datetime").datetime.fromisoformat("2026-12-01T13:12:00+00:00")) \
        == "3 h 12 min ago"


def test_the_report_page_has_the_decision_first_then_tables_then_each_plot_with_its_numbers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VPATCH_STATE", str(tmp_path))
    record = _record(tmp_path, "20261201-100000", decision="rolled back", image_id="sha256:bbb")
    page = deploy_html.render(record)
    decision = re.search(r'<p id="decision" class="decision rolled">(.*?)</p>', page)
    assert decision is not None and decision[1].startswith("Rolled back: the memory check failed: lowest 150 MiB free")
    assert page.index('id="decision"') < page.index("<h2>Checks</h2>") < page.index("<h2>Plots</h2>")
    # Self-contained: nothing fetched (an xmlns is a name, never loaded), no script.
    assert not re.search(r'(src|href)="(https?:)?//|url\((?!#)|@import', page) and "<script" not in page
    samples = dict(re.findall(r'data-plot="([a-z-]+)" data-samples="(\d+)"', page))
    assert samples == {"kv-blocks": "6", "requests": "2", "parallel": "5", "memory": "2", "throughput": "3"}
    for plot in samples:
        figure = page[page.index(f'id="plot-{plot}"'):]
        figure = figure[:figure.index("</figure>")]
        assert "<svg" in figure and "<table>" in figure, plot
    assert 'id="kv-candidate-held"' in page and 'id="kv-candidate-predicted"' in page
    unfinished = deploy_html.render(DeployRecord("tiny", "tiny-prod", "img:1", "20261201-120000", "k1"), phase="checking")
    assert "Unfinished: the deploy of img:1 stopped during checking" in unfinished


def test_the_container_memory_limit_is_read_and_rendered_as_docker_run_memory(tmp_path: Path) -> None:
    from helpers.serverimage import tiny_serve, write_project

    from vpatch.serve.render import render

    serve = tiny_serve(8000, "vpatch-memory")
    serve["container"]["memory"] = "3g"
    write_project(tmp_path, "img:1", serve)
    definition = ImageDefinition.load(tmp_path, "tiny")
    assert definition.serve is not None and definition.serve.container.memory == "3g"
    argv = render(definition.serve, "img:1", definition="tiny").argv
    assert argv[argv.index("--memory") + 1] == "3g"
    serve["container"]["memory"] = "lots"
    write_project(tmp_path, "img:1", serve)
    with pytest.raises(ConfigError, match=r"serve\.container\.memory"):
        ImageDefinition.load(tmp_path, "tiny").serve  # noqa: B018 (parsed on first use)


def test_deploy_report_renders_the_last_record_with_the_state_folder_only(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """`vpatch deploy NAME --report` needs no yaml and no daemon: the project here has no images/ at all."""
    from typer.testing import CliRunner

    from vpatch.commands.cli import app
    from vpatch.deploy.journal import Journal, Phase

    state = tmp_path / "state"
    monkeypatch.setenv("VPATCH_STATE", str(state))
    (tmp_path / "vpatch.yaml").write_text("pin:\n  ref: v0.32.0\n")
    runner = CliRunner()
    missing = runner.invoke(app, ["-C", str(tmp_path), "deploy", "tiny", "--report"])
    assert missing.exit_code == 1 and "no deploy of tiny is recorded" in missing.stderr
    _record(tmp_path, "20261201-090000", decision="deployed", image_id="sha256:aaa")
    killed = DeployRecord("tiny", "tiny-prod", "img:2", "20261201-100000", "k1").save()  # a kill -9 before any decision
    Journal("tiny", "tiny-prod", "img:2", Phase.CHECKING, started=killed.started).save()
    out = tmp_path / "page.html"
    shown = runner.invoke(app, ["-C", str(tmp_path), "deploy", "tiny", "--report", "--out", str(out)])
    assert shown.exit_code == 0 and shown.stdout.strip() == f"report: {out}", shown.output
    assert "Unfinished: the deploy of img:2 stopped during checking" in out.read_text()
    again = runner.invoke(app, ["-C", str(tmp_path), "deploy", "tiny", "--report"])
    assert again.exit_code == 0 and again.stdout.strip() == f"report: {killed.html_path}"
    for args, why in ((["--out", str(out)], "--out needs --report"), (["--baseline", "old"], "--baseline old is not one of")):
        bad = runner.invoke(app, ["-C", str(tmp_path), "deploy", "tiny", *args])
        assert bad.exit_code == 1 and why in bad.stderr, bad.output


def test_verify_live_page_names_every_case_and_its_verdict() -> None:
    """verify --live's page (commands/verify.py writes it beside the deploys' reports) from a report of the shipped
    0003 check: one passing case, one failing with its problem; the decision sentence says which patch failed."""
    from vpatch.deploy.live import CaseOutcome, LivePlan, LiveReport, PatchOutcome, Planned, Role
    from vpatch.deploy.livecheck import LiveCheck

    file = "checks/live/0003-qwen3-tool-call-unclosed-function.yaml"
    planned = Planned("0003-qwen3-tool-call-unclosed-function", Role.KEPT, file, LiveCheck.load(REPO / file))
    names = [case.name for case in planned.check.cases][:2]
    outcome = PatchOutcome(planned, (CaseOutcome(names[0], (), None, 0.4),
                                     CaseOutcome(names[1], ("no tool call named 'get_time' <&>",), None, 0.7)))
    plan = LivePlan((planned,), notes=("0002 names no Live-Check",))
    page = deploy_html.live_page("img:1", LiveReport(plan, (outcome,)), started="20261202-050000")
    decision = re.search(r'<p id="decision" class="decision (\w+)">([^<]*)</p>', page)
    assert decision is not None and decision[1] == "rolled"
    assert decision[2].startswith("Failed: img:1 fails the live check of 0003-qwen3-tool-call-unclosed-function (1 of 2")
    assert page.count('<td class="pass">pass</td>') == 1 and page.count('<td class="fail">fail</td>') == 1
    assert "no tool call named &#x27;get_time&#x27; &lt;&amp;&gt;" in page  # escaped, never raw HTML
    assert "note: 0002 names no Live-Check" in page and "<script" not in page
    passed = deploy_html.live_page("img:1", LiveReport(plan, (PatchOutcome(planned, outcome.cases[:1]),)), started="s")
    assert 'class="decision deployed">Passed: img:1 shows every fix its live checks name (1 case(s)).' in passed
    nothing = deploy_html.live_page("img:1", LiveReport(LivePlan(()), ()), started="s")
    assert "Nothing to run" in nothing and "<table>" not in nothing


def test_container_memory_reads_the_resident_part_on_cgroup_v1_and_v2() -> None:
    """docker's stats answer as this machine's daemon gives it (cgroup v1, read from a running test server) and as a
    cgroup v2 daemon names the same figures. A stand-in for docker's API: the daemon here runs cgroup v1 only, so
    the v2 shape cannot come from a real one (the v1 path runs for real in test_deploy_report_server.py)."""
    from types import SimpleNamespace

    from vpatch.docker.containers import ContainerMemory, Containers

    mib = 1024 * 1024
    v1 = {"usage": 667082752, "limit": 25276203008, "stats": {
        "total_rss": 589688832, "total_cache": 60559360, "total_active_file": 26353664, "total_inactive_file": 34205696}}
    v2 = {"usage": 700 * mib, "limit": 2048 * mib, "stats": {"anon": 500 * mib, "file": 200 * mib,
                                                             "active_file": 60 * mib, "inactive_file": 140 * mib}}
    for stats, expected in ((v1, ContainerMemory(667082752 - 34205696, 25276203008, 589688832)),
                            (v2, ContainerMemory(560 * mib, 2048 * mib, 500 * mib)),
                            ({"usage": 10 * mib, "limit": 20 * mib}, ContainerMemory(10 * mib, 20 * mib, None))):
        api = SimpleNamespace(stats=lambda name, stream, one_shot, s=stats: {"memory_stats": s})
        assert Containers(SimpleNamespace(api=api)).container_memory("c") == expected
    stopped = SimpleNamespace(stats=lambda name, stream, one_shot: {"memory_stats": {}})
    assert Containers(SimpleNamespace(api=stopped)).container_memory("c") is None
