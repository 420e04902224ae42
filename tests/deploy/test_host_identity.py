"""Production is touched only by the right hand, without docker: whom the health wait asks (another server
on the port, an IPv6 host, network none), the journal validated as a whole, one lock per container name
and port, and the state folder's failures as clear errors. The audit's cases (shared audits,
serve-deploy-bad-inputs.md) are named by their ids; the docker side is test_host_identity_docker.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers.serverimage import free_port, tiny_serve, tiny_yaml

from vpatch.base.errors import ConfigError, JournalError, VpatchError
from vpatch.base.lock import LockedError, LockFolderError, host_resources
from vpatch.base.paths import state_dir
from vpatch.config.definition import ImageDefinition
from vpatch.deploy import switch
from vpatch.deploy.journal import Journal, Phase
from vpatch.serve import alive, health
from vpatch.serve.render import for_definition

PARKED = "0123456789ab" * 2
CANDIDATE = "fedcba987654" * 2


class _OtherServer(BaseHTTPRequestHandler):
    """Another HTTP server holding the port (the audit's X73): /health 200, and a model that is not ours."""

    def do_GET(self) -> None:
        body = json.dumps({"data": [{"id": "someone-else"}]}).encode() if self.path == "/v1/models" else b""
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def other_server() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OtherServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def test_x73_an_answer_from_another_server_is_no_answer(other_server: int) -> None:
    verdict = alive.check(f"http://127.0.0.1:{other_server}", timeout=5, model="tiny")
    assert verdict.state == "down" and "'someone-else'" in verdict.detail and "'tiny'" in verdict.detail


def test_x73_a_port_something_answers_on_is_refused_before_the_start(other_server: int) -> None:
    with pytest.raises(VpatchError) as info:
        health.refuse_taken_port(other_server, None, source="images/tiny.yaml")
    assert f"127.0.0.1:{other_server}" in info.value.message and "'someone-else'" in info.value.message
    assert "serve.port in images/tiny.yaml" in (info.value.hint or "")
    health.refuse_taken_port(free_port(), None, source="images/tiny.yaml")  # a free port passes


def definition(tmp_path: Path, **overrides: object) -> ImageDefinition:
    container = overrides.pop("container", None)
    port = overrides.pop("port", 18610)
    assert isinstance(port, int)
    serve = tiny_serve(port, "audit-tiny", **overrides)
    if isinstance(container, dict):
        serve["container"] = {**serve["container"], **container}
    return ImageDefinition.parse(tiny_yaml("vpatch-test/vllm:x", serve), name="tiny",
                                 path=tmp_path / "images" / "tiny.yaml", source="images/tiny.yaml").validate()


def test_x86_an_ipv6_host_is_asked_in_brackets(tmp_path: Path) -> None:
    assert alive.base_url(8000, "::1") == "http://[::1]:8000"
    assert alive.base_url(8000, "0.0.0.0") == alive.base_url(8000, None) == "http://127.0.0.1:8000"
    command = for_definition(definition(tmp_path, host="::1")).shell_line()
    assert "http://[::1]:18610" in command and "http://::1:" not in command


def test_x87_network_none_is_refused_at_parse(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"serve.container.network' is none: the container has no network"):
        definition(tmp_path, container={"network": "none"})


def test_the_health_wait_asks_for_the_served_model_name(tmp_path: Path) -> None:
    assert definition(tmp_path).serve.model_name == "tiny"  # type: ignore[union-attr]
    plain = definition(tmp_path, served_model_name=None)
    assert plain.serve is not None and plain.serve.model_name == "/models/tiny-qwen3"


GOOD = {"definition": "tiny", "container": "audit-tiny", "image": "vpatch-test/vllm:x", "phase": "checking",
        "started": "20261201-060000", "parked_id": PARKED, "parked_name": "audit-tiny-parked-20261201-060000",
        "parked_restart": "unless-stopped", "candidate_started": True, "candidate_id": CANDIDATE, "port": 18610,
        "health_timeout_s": 600}


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("VPATCH_STATE", str(tmp_path / "state"))
    return tmp_path / "state"


def write_journal(state: Path, text: str) -> None:
    (state / "deploy").mkdir(parents=True, exist_ok=True)
    (state / "deploy" / "tiny.json").write_text(text)


@pytest.mark.parametrize(("change", "said"), [
    ({"candidate_id": PARKED}, "field 'candidate_id' names the parked production container"),  # X65
    ({"parked_id": "audit-other"}, "field 'parked_id' must be a container id"),  # X70f
    ({"parked_restart": "sometimes"}, "field 'parked_restart' must be a restart policy docker takes"),  # X69c
    ({"started": "yesterday"}, "field 'started' must be a time as YYYYmmdd-HHMMSS"),  # X69b
    ({"started": "20261399-250000"}, "field 'started' is no real time"),
    ({"health_timeout_s": 1e300}, "field 'health_timeout_s' is 1e+300 s, more than a week"),  # X63
    ({"container": "../x"}, "field 'container' is not a container name docker accepts"),
    ({"definition": "Other"}, "field 'definition' is not an image definition name"),
])
def test_a_hand_edited_journal_is_refused_before_anything_acts(state: Path, change: dict[str, object], said: str) -> None:
    write_journal(state, json.dumps({**GOOD, **change}))
    with pytest.raises(JournalError, match=said.replace("(", r"\(").replace("+", r"\+")):
        Journal.load("tiny")


def test_x61_a_journal_with_a_key_given_twice_is_refused(state: Path) -> None:
    text = json.dumps(GOOD)[:-1] + ', "phase": "deployed"}'
    write_journal(state, text)
    with pytest.raises(JournalError, match="the key 'phase' is given twice"):
        Journal.load("tiny")


@pytest.mark.parametrize(("note", "said"), [
    ("", "the last deploy of tiny was already rolled back"),  # J13 replayed: it said "rolled back ()"
    ("audit-tiny alive again after 40s", "the last deploy of tiny was already rolled back (audit-tiny alive again after 40s)"),
])
def test_j13_a_rollback_of_a_closed_deploy_says_so_with_what_to_do(state: Path, note: str, said: str) -> None:
    write_journal(state, json.dumps({**GOOD, "phase": "rolled-back", "note": note}))
    with pytest.raises(VpatchError) as info:
        switch.rollback(definition="tiny", docker=None, progress=lambda _: None)  # type: ignore[arg-type]  # never asked
    assert info.value.message == said
    assert info.value.hint == "nothing to roll back; `vpatch deploy tiny --status` shows what runs"


def test_x26_the_rollback_waits_as_long_as_production_needs(state: Path) -> None:
    write_journal(state, json.dumps({**GOOD, "health_timeout_s": 5, "restore_timeout_s": 600}))
    journal = Journal.load("tiny")
    assert journal is not None and journal.restore_wait_s == 600
    assert Journal("tiny", "c1", "i", Phase.CHECKING, "20261201-060000", health_timeout_s=5).restore_wait_s == 5
    assert Journal("tiny", "c1", "i", Phase.CHECKING, "20261201-060000").restore_wait_s == 900


def test_x57_a_relative_state_folder_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VPATCH_STATE", "relstate")
    with pytest.raises(VpatchError, match="VPATCH_STATE must be an absolute path, not 'relstate'"):
        Journal.load("tiny")


def test_one_lock_per_container_name_and_port(state: Path) -> None:
    """X110: serve, deploy, rollback and prune take the same locks, keyed by what they touch."""
    folder = state_dir() / "locks"
    with host_resources(folder, container="audit-tiny", port=18610, holder="vpatch deploy tiny"):
        for container, port in (("audit-tiny", 18611), ("audit-tiny2", 18610)):
            with pytest.raises(LockedError, match=r"another vpatch deploy tiny is running \(pid \d+\)"):
                with host_resources(folder, container=container, port=port, holder="vpatch serve tiny2"):
                    pass
        # Another process (as a second vpatch is): the kernel's lock, not this process's bookkeeping.
        code = ("import sys; from pathlib import Path; from vpatch.base.lock import host_resources\n"
                f"with host_resources(Path({str(folder)!r}), container='audit-tiny', port=1, holder='x'): pass")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert done.returncode == 1 and "another vpatch deploy tiny is running" in done.stderr
        with host_resources(folder, container="audit-other", port=18620, holder="vpatch serve other"):
            pass  # another container on another port: no wait


def test_x58_a_read_only_state_folder_is_a_clear_error(state: Path) -> None:
    """A folder without write permission; as root (who writes there anyway) /proc, where no one creates a file."""
    state.mkdir()
    state.chmod(0o555)
    folder = state / "locks" if os.geteuid() != 0 else Path("/proc/vpatch-state-test/locks")
    try:
        with pytest.raises(LockFolderError, match="cannot take the lock") as info:
            with host_resources(folder, container="c1", port=1, holder="x"):
                pass
        assert "must be a writable folder" in (info.value.hint or "")
    finally:
        state.chmod(0o755)


def test_j12_a_state_path_that_is_a_file_is_a_clear_error(state: Path) -> None:
    state.write_text("not a folder")
    with pytest.raises(LockFolderError, match=r"cannot take the lock .*/state is a file, not a folder$"):
        with host_resources(state / "locks", container="c1", port=1, holder="x"):
            pass
    with pytest.raises(JournalError, match=r"cannot write .*tiny\.json"):
        Journal("tiny", "c1", "i", Phase.BASELINE, "20261201-060000").save()
    assert state.read_text() == "not a folder"


def test_x59_a_full_state_folder_is_a_clear_error(state: Path) -> None:
    """/dev/full answers every write with ENOSPC, as a full disk does."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    from vpatch.base import records

    with pytest.raises(OSError):
        Path("/dev/full").write_bytes(b"x")
    state.mkdir()
    (state / "deploy").symlink_to("/dev/full")  # a "folder" no file can be written into
    with pytest.raises(JournalError, match="cannot write"):
        records.save(state / "deploy" / "tiny.json", Journal("tiny", "c1", "i", Phase.BASELINE, "20261201-060000"))


@pytest.mark.parametrize("shape", ["folder", "dangling", "loop", "long"])
def test_x50_x55_a_definition_that_is_no_file_is_named_as_such(tmp_path: Path, shape: str) -> None:
    images = tmp_path / "images"
    images.mkdir()
    name = "t" * 300 if shape == "long" else "tiny"
    path = images / "tiny.yaml"
    if shape == "folder":
        path.mkdir()
    elif shape == "dangling":
        path.symlink_to(images / "gone.yaml")
    elif shape == "loop":
        path.symlink_to(path)
    with pytest.raises(ConfigError) as info:
        ImageDefinition.load(tmp_path, name)
    said = {"folder": "images/tiny.yaml is a folder", "dangling": "which does not exist",
            "loop": "which does not exist (or loops)", "long": "is not an image definition name"}[shape]
    assert said in info.value.message and "no image definition" not in info.value.message


def deploy_section(tmp_path: Path, **deploy: object) -> str:
    import yaml

    serve = tiny_serve(18610, "audit-tiny")
    return tiny_yaml("vpatch-test/vllm:x", serve) + yaml.safe_dump({"deploy": deploy}, sort_keys=False)


def parsed(tmp_path: Path, text: str) -> ImageDefinition:
    return ImageDefinition.parse(text, name="tiny", path=tmp_path / "images" / "tiny.yaml",
                                 source="images/tiny.yaml").validate()


@pytest.mark.parametrize(("written", "said"), [
    ("max_num_seqs: 010", "key 'serve.max_num_seqs' is written 010, which YAML 1.1 reads as 8"),  # X03
    ("max_num_seqs: 0x10", "is written 0x10, which YAML 1.1 reads as 16"),
    ("max_num_seqs: 1_0", "is written 1_0, which YAML 1.1 reads as 10"),
    ("health_timeout: 1:30", "is written 1:30, which YAML 1.1 reads as 90"),
    ('port: "18610"', "key 'serve.port' must be a positive whole number, not '18610'"),  # S04: the quotes shown
    ("port: 018610", "not 018610 (YAML reads it as text: a leading zero)"),  # X02
])
def test_typed_keys_are_read_as_written(tmp_path: Path, written: str, said: str) -> None:
    key = written.partition(": ")[0]
    serve = tiny_serve(18610, "audit-tiny")
    serve[key] = 1
    text = tiny_yaml("vpatch-test/vllm:x", serve).replace(f"  {key}: 1\n", f"  {written}\n")
    assert written in text
    with pytest.raises(ConfigError) as info:
        parsed(tmp_path, text)
    assert said in info.value.message, info.value.message


@pytest.mark.parametrize(("deploy", "said"), [
    ({"checks": {"block_cost": {"prompt_tokens": 100, "max_ratio": 0.5}}},
     "'deploy.checks.block_cost.max_ratio' is 0.5: the ratio is the blocks the request holds over"),  # X30
    ({"checks": {"log_scan": {"patterns": []}}}, "'deploy.checks.log_scan.patterns' is an empty list"),  # D28
    ({"checks": {"tool_call": {"extra": {"stream": False}}}}, "'deploy.checks.tool_call.extra.stream' is a field"),  # X36
    ({"checks": {"tool_call": {"extra": {"tool_choice": "none"}}}}, "'deploy.checks.tool_call.extra.tool_choice'"),  # X37
    ({"checks": {"parallel": {"requests": 100000, "prompt_tokens": 8}}},
     "'deploy.checks.parallel.requests' is 100,000: the check sends them all at once, to production too"),  # X44
    ({"request_timeout_s": 0.001}, "'deploy.request_timeout_s' is 0.001 s, under 1 s"),  # X28
    ({"stall_s": 0.001}, "'deploy.stall_s' is 0.001 s, under 1 s"),  # X29
    ({"start_watch_s": 30000}, "'deploy.start_watch_s' is 30000 s, over 3600 s"),  # X27
])
def test_a_check_that_can_never_pass_or_tests_nothing_is_refused(tmp_path: Path, deploy: dict[str, object],
                                                                 said: str) -> None:
    with pytest.raises(ConfigError) as info:
        parsed(tmp_path, deploy_section(tmp_path, **deploy)).deploy  # noqa: B018 (the section loads lazily)
    assert said in info.value.message, info.value.message


@pytest.mark.parametrize(("serve", "said"), [
    ({"model": "/models/tiny-qwen3 "}, "'serve.model' has white space at its start or end"),  # X90
    ({"tensor_parallel_size": 4, "container": {"gpus": "device=0,1"}},
     "x pipeline_parallel_size is 4, but serve.container.gpus (device=0,1) gives 2 GPU(s)"),  # X09
    ({"tensor_parallel_size": 4, "container": {"gpus": "2"}}, "gives 2 GPU(s)"),  # X10
    ({"health_timeout": 10**12}, "'serve.health_timeout' is 1,000,000,000,000 s, over a week"),  # X97
    ({"command": ["serve", "--"]}, "'serve.command[1]' is `--`: it ends vLLM's options"),  # R15
])
def test_serve_values_that_would_misbehave_are_refused(tmp_path: Path, serve: dict[str, object], said: str) -> None:
    with pytest.raises(ConfigError) as info:
        definition(tmp_path, **serve)
    assert said in info.value.message, info.value.message


@pytest.mark.parametrize(("image", "said"), [
    ({"registry": "local_host:port"}, "'image.registry' must be host[:port]"),  # S78, B06
    ({"tag": "t" * 200}, "(200 characters; docker takes at most 128)"),  # X17
])
def test_image_names_docker_would_refuse_later_are_refused_now(tmp_path: Path, image: dict[str, str], said: str) -> None:
    import yaml

    doc = yaml.safe_load(tiny_yaml("vpatch-test/vllm:x", tiny_serve(18610, "audit-tiny")))
    doc["image"].update(image)
    with pytest.raises(ConfigError) as info:
        parsed(tmp_path, yaml.safe_dump(doc))
    assert said in info.value.message, info.value.message


@pytest.mark.parametrize(("args", "said"), [
    (["serve", "tiny", "--print", "--diff"], "--print and --diff cannot be combined"),  # F01
    (["serve", "tiny", "--print", "--replace"], "--print and --replace cannot be combined"),  # X60
    (["serve", "tiny", "--print", "--check"], "--print and --check cannot be combined"),  # X61
    (["serve", "tiny", "--print", "--image", "Not Valid; rm -rf /"], "--image 'Not Valid; rm -rf /' is not an image"),  # F06
    (["serve", "tiny", "--print", "--image", "Vpatch-Test/VLLM:x"], "is not an image reference"),  # X64
    (["serve", "tiny", "--print", "--image", ""], "--image '' is not an image reference"),  # X63
    (["deploy", "tiny", "--status", "--rollback"], "--status and --rollback cannot be combined"),  # F02
    (["deploy", "tiny", "--rollback", "--prune"], "--rollback and --prune cannot be combined"),  # X53
    (["deploy", "tiny", "--status", "--json"], "--json goes with a deploy's report only"),  # X54
    (["deploy", "tiny", "--keep", "0"], "--keep goes with --prune only"),  # X52
    (["deploy", "tiny", "--image", ""], "--image is empty"),  # X63b
    (["deploy", "tiny", "--rollback", "--image", "x"], "--image goes with a deploy only"),  # F08
])
def test_flags_that_would_be_ignored_are_refused(tmp_path: Path, state: Path, args: list[str], said: str) -> None:
    from typer.testing import CliRunner

    from vpatch.commands.cli import app

    result = CliRunner().invoke(app, ["-C", str(tmp_path), *args])
    assert result.exit_code == 1 and said in result.output, result.output
    assert not state.exists()  # nothing was begun


def test_x73_the_containers_own_health_check_asks_for_the_served_model(tmp_path: Path, other_server: int) -> None:
    """The health command docker runs, run here as it is rendered: another server on the port is down."""
    import shlex

    from vpatch.serve.render import health_check

    serve = definition(tmp_path, port=other_server).serve
    assert serve is not None
    words = shlex.split(health_check(serve).command)
    assert words[-2:] == ["--model", "tiny"]
    ran = subprocess.run([sys.executable, *words[1:-4], "--state", str(tmp_path / "s.json"), *words[-2:]],
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 1 and ran.stdout.startswith("down: ") and "'someone-else'" in ran.stdout, ran.stdout
