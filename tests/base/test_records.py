"""Journals on disk (vpatch.base.records): a record round-trips, a missing one is None, and every broken one, the
update's and the deploy's alike, is one JournalError naming the file and what to do."""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
from conftest import Project
from conftest import vpatch_cli as run
from helpers.project import commit_all

from vpatch.base import records
from vpatch.base.errors import JournalError
from vpatch.deploy.journal import Journal, Phase


class Color(str, Enum):
    RED = "red"


@dataclass(frozen=True)
class Sample:
    name: str
    color: Color

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "color": self.color.value}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sample:
        return cls(data["name"], Color(data["color"]))


def load(path: Path) -> Sample | None:
    return records.load(path, Sample.from_dict, what="the sample journal", hint="delete it")


def test_a_record_round_trips_atomically_and_a_missing_one_is_none(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "sample.json"
    assert load(path) is None
    records.save(path, Sample("a", Color.RED))
    assert load(path) == Sample("a", Color.RED)
    assert json.loads(path.read_text()) == {"name": "a", "color": "red"}
    assert [p.name for p in path.parent.iterdir()] == ["sample.json"]  # no temporary file left


@pytest.mark.parametrize(("content", "why"), [
    (b"{not json", "Expecting property name"),
    (b"[1, 2]", "it must be a JSON object, not an array"),
    (b"null", "it must be a JSON object, not null"),  # JSON's words, never Python's 'NoneType'
    (b'"tiny"', "it must be a JSON object, not a string"),
    (b'{"name": "a"}', "no field 'color'"),
    (b'{"name": "a", "color": "blue"}', "'blue' is not a valid Color"),
    (b"\xff\xfe", "can't decode"),
])
def test_a_broken_record_is_a_journal_error_naming_the_file(tmp_path: Path, content: bytes, why: str) -> None:
    path = tmp_path / "sample.json"
    path.write_bytes(content)
    with pytest.raises(JournalError) as caught:
        load(path)
    assert caught.value.message.startswith(f"the sample journal {path} is unreadable: ")
    assert why in caught.value.message and caught.value.hint == "delete it"


def test_a_folder_in_place_of_the_record_is_a_journal_error(tmp_path: Path) -> None:
    (tmp_path / "sample.json").mkdir()
    with pytest.raises(JournalError, match="is unreadable"):
        load(tmp_path / "sample.json")


def test_the_deploy_journal_and_the_update_journal_refuse_alike(project: Project, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VPATCH_STATE", str(tmp_path / "state"))
    Journal("x", "vllm-x", "img", Phase.BASELINE, "20260924-201500").save()
    Journal.path_for("x").write_text('{"definition": "x"}')
    with pytest.raises(JournalError, match=r"the deploy journal .*x\.json is unreadable: field 'container' is missing"):
        Journal.load("x")

    commit_all(project)
    work = project.root / ".git" / "vpatch-update"
    work.mkdir()
    (work / "commit.json").write_text('{"ref": "refs/heads/main", "old": 1}')
    for command in ("--continue", "--abort"):
        code, out = run(project, "update", command)
        assert code == 1, out
        assert f"the commit journal of an interrupted update {work / 'commit.json'} is unreadable" in out
        assert "'old' is missing or not a string" in out and "Traceback" not in out and "internal error" not in out
        assert f"then delete {work}" in out
