"""The operator's loop on the real vLLM 0.32.0 CPU server, with the patches' live checks: update -> build
(overlay on the CPU server image, images/vllm-cpu.yaml) -> verify -> deploy; deploy refusing a candidate
whose files do not match its labels; a dropped patch's live check failing on the candidate (false-drop
alarm, rollback); `verify IMAGE --live`.

One project and one production container for the module, in file order (each test leaves production
running and healthy): the module fixture runs update and build; the loop's deploy, first, is a first deploy
onto an empty host and makes production (the built image), which the later tests use. Server starts dominate
the time (35-300 s each on the loaded 2-core machine; four in all: the loop's deploy, the false-drop candidate
and production's restore, `verify --live`'s own server). A run in another order starts production itself
where a test needs it and finds none (one start more, said on stdout).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import REAL_CACHE
from helpers import browser
from helpers.serverimage import free_port, unique_name
from typer.testing import CliRunner

from vpatch.commands.cli import app
from vpatch.config.definition import ImageDefinition
from vpatch.deploy.client import Server
from vpatch.docker import Docker
from vpatch.series.retired import RETIRED_FILE, RetiredPatch, with_entries
from vpatch.serve.render import render

# Its own production server, not the shared tiny one: the shipped vllm-cpu definition serving the image this
# module builds (update + build in the module fixture). It runs on the real-server worker (conftest.py).
pytestmark = [pytest.mark.docker, pytest.mark.releases]
REPO = Path(__file__).resolve().parents[2]
NAME = "vllm-cpu"
P0003 = "0003-qwen3-tool-call-unclosed-function"
LIVE_0003 = f"checks/live/{P0003}.yaml"
CASE_1 = "function name left open before </tool_call>"


@dataclass
class Loop:
    root: Path
    env: dict[str, str]
    docker: Docker
    server_image: str  # the plain vLLM 0.32.0 CPU server image: what upstream's image would be, no patch
    repository: str  # this module's own image repository (removed at the end)
    container: str
    port: int
    update_out: str
    build_out: str

    def cli(self, *args: str, root: Path | None = None) -> tuple[int, str, str]:
        # Wide tables: a live-check row (patch, case, what the server answered) stays on one line.
        result = CliRunner().invoke(app, ["-C", str(root or self.root), *args], env={**self.env, "COLUMNS": "260"})
        return result.exit_code, result.stdout, result.stderr

    @property
    def candidate(self) -> str:
        return f"{self.repository}:cpu-next"

    @property
    def server(self) -> Server:
        return Server(f"http://127.0.0.1:{self.port}", timeout=300)

    def production_id(self) -> str:
        info = self.docker.container(self.container)
        assert info is not None and info.status == "running", info
        return info.id

    def production(self) -> str:
        """Production's container id. In file order the loop's deploy made it; a test that runs before that
        (a shuffled or a -k run) starts it here from the built image, as that deploy would have."""
        info = self.docker.container(self.container)
        if info is None or info.status != "running":
            print(f"\n[no production under {self.container} (the loop's deploy has not run): started from "
                  f"{self.candidate}, one server start more]")
            self.run_production(self.candidate)
        return self.production_id()

    def run_production(self, image: str) -> None:
        """Replace whatever holds the production name by `image`, started from the yaml, and wait for /health."""
        if self.docker.container(self.container) is not None:
            self.docker.remove_container(self.container)
        definition = ImageDefinition.load(self.root, NAME)
        assert definition.serve is not None
        self.docker.run_cli(render(definition.serve, image, definition=NAME).argv)
        deadline = time.monotonic() + 600
        while not self.server.healthy():
            assert time.monotonic() < deadline, self.docker.container_logs(self.container, tail=30)
            time.sleep(1)

    def restored(self, before: str) -> None:
        assert self.production_id() == before, "another container holds the production name"
        assert self.server.healthy()
        for c in self.docker.client.containers.list(all=True, filters={"name": f"{self.container}-candidate-"}):
            c.remove(force=True)  # the kept candidate, removed here only to keep the shared daemon tidy


def _git(root: Path, env: dict[str, str], *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, env=env, check=True, capture_output=True)


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory, vllm_server_image: str, release_history: Path) -> Iterator[Loop]:
    """A copy of this project (pin v0.29.0, the shipped series), `vpatch update --to v0.32.0`, then `vpatch build
    vllm-cpu` on the CPU server image. No production: the loop's deploy makes it (`Loop.production` where that
    has not run)."""
    import os

    del release_history  # built in the real cache, where update reads it
    home = tmp_path_factory.mktemp("live-home")
    env = {"VPATCH_CACHE": str(REAL_CACHE), "VPATCH_STATE": str(tmp_path_factory.mktemp("live-state")),
           "HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": str(home / ".gitconfig"),
           "GIT_AUTHOR_NAME": "Test Person", "GIT_AUTHOR_EMAIL": "test@vpatch.invalid",
           "GIT_COMMITTER_NAME": "Test Person", "GIT_COMMITTER_EMAIL": "test@vpatch.invalid"}
    root = tmp_path_factory.mktemp("live-project")
    for name in ("vpatch.yaml", "Dockerfile"):
        shutil.copyfile(REPO / name, root / name)
    for folder in ("patches", "checks"):
        shutil.copytree(REPO / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "images").mkdir()
    uid = unique_name("live")
    repository, container, port = f"vpatch-test/{uid}", f"vpatch-{uid}", free_port()
    # The shipped definition, with this module's own repository, container name and port, on this machine's
    # server image (the shipped base.image is the tag the recipe had when it was written).
    doc = yaml.safe_load((REPO / "images" / f"{NAME}.yaml").read_text())
    doc["image"]["repository"] = repository
    doc["base"]["image"] = vllm_server_image
    doc["serve"]["port"] = port
    doc["serve"]["container"]["name"] = container
    (root / "images" / f"{NAME}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    git_env = {**os.environ, **env}
    _git(root, git_env, "init", "-q", "-b", "main")
    _git(root, git_env, "add", "-A")
    _git(root, git_env, "commit", "-q", "-m", "project")
    docker = Docker.connect()
    partial = Loop(root, env, docker, vllm_server_image, repository, container, port, "", "")
    code, update_out, err = partial.cli("update", "--to", "v0.32.0")
    assert code == 0, update_out + err
    code, build_out, err = partial.cli("build", NAME)
    assert code == 0, build_out + err
    loop = Loop(root, env, docker, vllm_server_image, repository, container, port, update_out, build_out)
    try:
        yield loop
    finally:
        for c in docker.client.containers.list(all=True, filters={"name": container}):
            c.remove(force=True)
        for image in docker.client.images.list(name=repository):
            for tag in image.tags:
                docker.remove_image(tag)


def test_loop_update_build_verify_deploy_with_the_live_checks(loop: Loop) -> None:
    # update: 0001 and 0002 dropped (upstream has them by v0.32.0), 0003 kept; its live check file stays.
    assert sorted(p.name[:4] for p in (loop.root / "patches").glob("*.patch")) == ["0003"]
    assert (loop.root / LIVE_0003).is_file()
    # build: the overlay on the CPU server image; verify: the image holds the pin plus the series.
    assert "overlay" in loop.build_out
    code, out, err = loop.cli("verify", loop.candidate)
    assert code == 0 and "vllm/parser/qwen3.py" in out and "matches its labels" in out, out + err
    # A first deploy onto an empty host: it makes production. In file order nothing holds the name yet; in
    # another order a test may have started production already: removing it costs nothing, a start does.
    if loop.docker.container(loop.container) is not None:
        loop.docker.remove_container(loop.container)
    code, out, err = loop.cli("deploy", NAME, "--json")
    report = json.loads(out)
    live = report["live"]
    assert live["verified"] and "passed" in live["verified"], err  # deploy ran `vpatch verify` first
    # No production, so no baseline: nothing measured, nothing parked, nothing dropped since a baseline's pin.
    assert report["baseline"] is None and live["baseline"] == [] and report["parked_as"] is None, out
    assert live["planned"] == [{"patch": P0003, "role": "kept", "file": LIVE_0003}] and live["notes"] == []
    suite = {c["name"]: c["status"] for c in report["candidate"]["checks"] if not c["name"].startswith("live ")}
    assert {k: suite.get(k) for k in ("started", "health", "kv pool", "tool call", "log scan")} == dict.fromkeys(
        ("started", "health", "kv pool", "tool call", "log scan"), "pass"), suite
    (outcome,) = live["candidate"]
    assert outcome["patch"] == P0003 and len(outcome["cases"]) == 9 and not outcome["false_drop"]
    # The log scan comes last: what a live-check request made the server log is scanned too.
    assert [c["name"] for c in report["candidate"]["checks"]][-2:] == [f"live {P0003} (kept)", "log scan"]
    # The decision follows the live check, and 0003 as on main passes it: the candidate is deployed.
    assert outcome["ok"] and all(c["ok"] for c in outcome["cases"]), json.dumps(outcome, indent=1)
    assert code == 0 and report["decision"] == "deployed", out
    # Production now is the candidate's container, with the yaml's restart policy: the later tests use it.
    info = loop.docker.container(loop.container)
    assert info is not None and info.status == "running" and info.restart_policy == "unless-stopped", info
    assert info.image_id == loop.docker.image(loop.candidate).id
    print(json.dumps(live, indent=1))


def test_a_dropped_patch_failing_its_live_check_on_the_candidate_is_a_false_drop_and_rolls_back(loop: Loop) -> None:
    # Production runs the image with 0003 (its labels name it); the project then drops 0003 as landed
    # upstream, as `vpatch update` would (RETIRED.md keeps its Live-Check), and the candidate is the plain
    # vLLM 0.32.0 server: the drop says upstream fixed the bug, and the server must show it.
    before = loop.production()
    assert loop.docker.container(loop.container).image_id == loop.docker.image(loop.candidate).id  # type: ignore[union-attr]
    dropped = loop.root.parent / f"{loop.root.name}-dropped"
    shutil.copytree(loop.root, dropped)
    (dropped / "patches" / f"{P0003}.patch").unlink()
    retired = dropped / "patches" / RETIRED_FILE
    entry = RetiredPatch(3, P0003[5:], "qwen3 parser: close a tool call whose <function= is left open", "v0.32.0",
                         ("probe: (this test) passes on the unpatched tree",), "update v0.29.0 -> v0.32.0",
                         f"HEAD:patches/{P0003}.patch", live_check=LIVE_0003)
    retired.write_bytes(with_entries(retired.read_bytes(), [entry]))
    # --baseline measure: production runs an image deployed with this very suite, so by default its recorded
    # figures would stand in and no live check would run on it; measured, it runs 0003's check too.
    code, out, err = loop.cli("deploy", NAME, "--image", loop.server_image, "--baseline", "measure", root=dropped)
    assert code == 6, out + err
    assert f"decision: rolled back (live {P0003} (dropped) failed)" in out
    assert f"false-drop alarm: {P0003} was dropped as upstream (Applied-Upstream: v0.32.0" in out
    assert "FALSE DROP" in out
    # The plain server's answer to case 1, in the live-check table: the name swallows the rest, no content.
    (row,) = [line for line in out.splitlines() if f" {CASE_1} " in line and "(dropped)" in line]
    assert "name 'get_weather\\n</tool_call>\\nIt is sunny.', expected 'get_weather'" in row, row
    # The cell wraps since 0003's longer well-formed case labels widened the table: its rest is on the next line.
    assert "content '', expected" in row, row
    rest = out.splitlines()[out.splitlines().index(row) + 1]
    assert "'It is sunny.'" in rest, row + "\n" + rest
    # The baseline ran the same live check, for the report: production, with 0003, passes every case where
    # the candidate fails case 1. The live-check table's rows: patch, case, baseline, candidate, answered.
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in out.splitlines() if line.startswith("│")]
    cases = {cells[1]: (cells[2], cells[3]) for cells in rows if len(cells) == 5 and cells[0] == f"{P0003} (dropped)"}
    assert len(cases) == 9 and {base for base, _ in cases.values()} == {"pass"}, cases
    assert cases[CASE_1] == ("pass", "fail"), cases
    loop.restored(before)
    print(out)  # docs/live-checks.md's report comes from here (pytest -s)


def test_deploy_refuses_a_candidate_whose_files_do_not_match_its_labels(loop: Loop, tmp_path: Path) -> None:
    before = loop.production()
    containers = sorted(c.name for c in loop.docker.client.containers.list(all=True, filters={"name": loop.container}))
    journal = Path(loop.env["VPATCH_STATE"]) / "deploy" / f"{NAME}.json"
    journal_before = journal.read_bytes() if journal.exists() else None
    # The candidate's labels say pin v0.32.0 + 0003, but its qwen3.py was changed after the build.
    tampered = f"{loop.repository}:tampered"
    package = loop.docker.image(loop.candidate).labels["io.vpatch.package_dir"]
    (tmp_path / "Dockerfile").write_text(f"FROM {loop.candidate}\nRUN echo '# changed' >> {package}/parser/qwen3.py\n")
    loop.docker.build(tmp_path, tag=tampered, buildargs={}, labels={})
    code, out, err = loop.cli("deploy", NAME, "--image", tampered)
    assert code == 1, out + err
    assert f"candidate {tampered} does not match its labels" in err and "vllm/parser/qwen3.py" in err
    assert "production was not touched" in err
    assert loop.production_id() == before  # never parked, never stopped
    assert (journal.read_bytes() if journal.exists() else None) == journal_before  # no deploy was begun
    assert sorted(c.name for c in loop.docker.client.containers.list(all=True, filters={"name": loop.container})) \
        == containers  # no candidate was started, nothing renamed


def test_verify_live_starts_the_image_and_runs_its_live_checks(loop: Loop) -> None:
    code, out, err = loop.cli("verify", loop.candidate, "--live")
    lines = [line for line in out.splitlines() if line.startswith(("ok   live", "FAIL live"))]
    assert len(lines) == 9, out + err
    assert f"ok   live {P0003}: well-formed call (control)" in lines
    # 0003 as on main fixes every case through the server (its check forces the tags as tokens).
    assert [line for line in lines if line.startswith("FAIL")] == [] and code == 0, out + err
    assert "healthy after" in err
    # Its page, beside the deploys' reports, as a browser shows it: the verdict and all 9 cases passed.
    (shown,) = [line for line in out.splitlines() if line.startswith("report: ")]
    page = Path(shown.removeprefix("report: "))
    assert page.parent == Path(loop.env["VPATCH_STATE"]) / "deploy" / "reports"
    loaded = browser.load(page)
    assert not [line for line in loaded.console if "error" in line.lower()], loaded.console
    assert f"Passed: {loop.candidate} shows every fix its live checks name (9 case(s))." in loaded.dom
    assert loaded.dom.count('<td class="pass">pass</td>') == 9 and 'class="fail"' not in loaded.dom
    leftovers = loop.docker.client.containers.list(all=True, filters={"name": f"{loop.container}-verify-"})
    assert not leftovers  # the container it started is gone; production was never touched
    print(out)
