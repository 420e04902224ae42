"""The deploy journal: where it lives, that each step's record survives a reload, that a broken one is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from vpatch.base.errors import ConfigError, JournalError
from vpatch.deploy.journal import Journal, Phase


def test_journal_round_trips_each_phase_and_lives_in_the_state_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VPATCH_STATE", str(tmp_path / "state"))
    journal = Journal("flash-next", "vllm-flash-next", "ml/vllm-flash:new", Phase.BASELINE, "20260924-201500").save()
    assert journal.path == tmp_path / "state" / "deploy" / "flash-next.json"
    parked = journal.advance(Phase.PARKING, parked_id="abc123abc123", parked_name="vllm-flash-next-parked-20260924-201500",
                             parked_restart="unless-stopped")
    assert Journal.load("flash-next") == parked and not parked.phase.settled
    assert Journal.load("flash-next").phase is Phase.PARKING  # type: ignore[union-attr]
    assert parked.advance(Phase.ROLLED_BACK).phase.settled
    assert Journal.load("other") is None
    assert not list((tmp_path / "state" / "deploy").glob(".*.tmp"))  # atomic writes leave no temporary file


def test_default_state_folder_follows_xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VPATCH_STATE", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert Journal.path_for("x") == tmp_path / "vpatch" / "deploy" / "x.json"


def test_a_broken_journal_is_refused_with_a_hint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VPATCH_STATE", str(tmp_path))
    (tmp_path / "deploy").mkdir()
    (tmp_path / "deploy" / "x.json").write_text('{"phase": "half-way"}')
    with pytest.raises(JournalError, match="unreadable") as info:
        Journal.load("x")
    assert info.value.hint and "docker ps -a" in info.value.hint


GOOD = {"definition": "x", "container": "vllm-x", "image": "ml/x:new", "phase": "deployed", "started": "20260924-201500",
        "parked_id": "abc123abc123", "parked_name": "vllm-x-parked-20260924-201500", "parked_restart": "unless-stopped",
        "candidate_started": True, "candidate_id": "def456def456", "candidate_kept_as": None, "note": ""}


@pytest.mark.parametrize(("change", "message"), [
    ({"parked_id": 12345}, "field 'parked_id' must be a non-empty string or null, not 12345"),
    ({"container": None}, "field 'container' must be a non-empty string, not null"),
    ({"candidate_started": "yes"}, "field 'candidate_started' must be true or false, not \"yes\""),
    ({"phase": "half-way"}, "field 'phase' must be one of baseline, parking,"),
    ({"phase": None}, "field 'phase' must be one of"),
    ({"parked": "abc"}, "field 'parked' is not a journal field"),
    ({"started": ""}, "field 'started' must be a non-empty string"),
    ({"port": "8000"}, "field 'port' must be a port number (1-65535) or null, not \"8000\""),
    ({"health_timeout_s": float("nan")}, "field 'health_timeout_s' must be a positive number of seconds or null"),
    ({"definition": "other"}, "field 'definition' is 'other', but the file is the journal of 'x'"),
])
def test_each_journal_field_is_checked_with_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        change: dict[str, object], message: str) -> None:
    import json

    monkeypatch.setenv("VPATCH_STATE", str(tmp_path))
    (tmp_path / "deploy").mkdir()
    (tmp_path / "deploy" / "x.json").write_text(json.dumps({**GOOD, **change}))
    with pytest.raises(JournalError) as info:
        Journal.load("x")
    assert f"the deploy journal {tmp_path / 'deploy' / 'x.json'} is unreadable: {message}" in info.value.message
    assert info.value.hint and "docker ps -a" in info.value.hint


def test_a_complete_journal_loads_and_a_missing_field_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    monkeypatch.setenv("VPATCH_STATE", str(tmp_path))
    (tmp_path / "deploy").mkdir()
    path = tmp_path / "deploy" / "x.json"
    path.write_text(json.dumps(GOOD))
    loaded = Journal.load("x")
    assert loaded is not None and loaded.phase is Phase.DEPLOYED and loaded.parked_id == "abc123abc123"
    assert loaded.path == path  # saved again, it is written under its own name
    path.write_text(json.dumps({k: v for k, v in GOOD.items() if k != "image"}))
    with pytest.raises(JournalError, match="field 'image' is missing"):
        Journal.load("x")
    path.write_text("[1, 2]")
    with pytest.raises(JournalError, match="it must be a JSON object, not an array"):
        Journal.load("x")
    path.write_text("null")
    with pytest.raises(JournalError, match="it must be a JSON object, not null"):
        Journal.load("x")
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(JournalError, match="unreadable"):
        Journal.load("x")


@pytest.mark.parametrize("name", ["../x", "a/b", "", "X"])
def test_a_definition_name_that_is_no_file_name_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="is not an image definition name"):
        Journal.path_for(name)
