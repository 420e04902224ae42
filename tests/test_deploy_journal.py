"""The deploy journal: where it lives, that each step's record survives a reload, that a broken one is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from vpatch.deploy.journal import Journal, Phase
from vpatch.errors import ConfigError


def test_journal_round_trips_each_phase_and_lives_in_the_state_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VPATCH_STATE", str(tmp_path / "state"))
    journal = Journal("flash-next", "vllm-flash-next", "ml/vllm-flash:new", Phase.BASELINE, "20260924-201500").save()
    assert journal.path == tmp_path / "state" / "deploy" / "flash-next.json"
    parked = journal.advance(Phase.PARKING, parked_id="abc123", parked_name="vllm-flash-next-parked-20260924-201500",
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
    with pytest.raises(ConfigError, match="unreadable") as info:
        Journal.load("x")
    assert info.value.hint and "docker ps -a" in info.value.hint
