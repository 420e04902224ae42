"""`vpatch deploy` over two hosts on two real docker daemons (tests/helpers/fleet.py): the standby is switched and
checked, and answers a real request, before the lane is diverted to it and production is parked; a standby that
fails is rolled back and production is never parked. Each test here starts real servers: the candidates, and
what a rollback starts again (the count is in each test's comment)."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from helpers.deployhost import KV_TOO_SMALL
from helpers.fleet import NAME, Fleet

from vpatch.docker import Docker


def suite(marks: Path) -> dict[str, Any]:
    """A small suite (the KV pool, sized to each host's own budget) and the lane's hooks, which leave a file each."""
    return {"start_watch_s": 3, "health_timeout_s": 600, "request_timeout_s": 300,
            "checks": {"kv_pool": {"min_tokens": 1024, "max_drop": 0.9}},
            "hooks": {"before_switch": [["touch", str(marks / "diverted")]],
                      "after_switch": [["touch", str(marks / "back")]]}}


def when(stamp: str) -> float:
    """A docker time (RFC 3339, nanoseconds) as seconds since the epoch."""
    return datetime.fromisoformat(re.sub(r"(\.\d{6})\d*", r"\1", stamp).replace("Z", "+00:00")).timestamp()


def state(docker: Docker, name: str) -> dict[str, Any]:
    return docker.client.api.inspect_container(name)["State"]


def parked(fleet: Fleet) -> set[str]:
    """Production's parked containers (earlier deploys leave theirs, stopped)."""
    found = fleet.production().client.api.containers(all=True, filters={"name": f"{fleet.container}-parked"})
    return {c["Id"] for c in found}


def test_the_standby_is_switched_checked_and_answers_before_production_is_parked(tiny_fleet: Fleet,
                                                                                 tmp_path: Path) -> None:
    # Two server starts: the standby's candidate, then production's.
    tiny_fleet.write(deploy=suite(tmp_path))
    before = {h: d.container(tiny_fleet.container) for h, d in (("standby", tiny_fleet.standby()),
                                                               ("production", tiny_fleet.production()))}
    code, out, err = tiny_fleet.cli("deploy", NAME, "--json")
    assert code == 0, out + err
    doc = json.loads(out)
    assert [(h["host"], h["role"], h["decision"]) for h in doc["hosts"]] == [("standby", "standby", "deployed"),
                                                                             ("production", "production", "deployed")]
    assert doc["deployed"] and doc["diverted"] and doc["halted_at"] is None
    assert doc["answer"]["tokens"] == 8 and doc["answer"]["url"] == f"http://{tiny_fleet.daemon.address}:{tiny_fleet.port}"
    # The order, by the daemons' own clocks and the hooks' files: the standby's candidate started (and passed),
    # then the lane went to it, then production was parked and its candidate started, then the lane came back.
    standby = tiny_fleet.standby().container(tiny_fleet.container)
    production = tiny_fleet.production().container(tiny_fleet.container)
    assert standby is not None and production is not None and before["standby"] and before["production"]
    assert standby.id != before["standby"].id and production.id != before["production"].id
    parked = doc["hosts"][1]["parked_as"]
    diverted, back = (tmp_path / "diverted").stat().st_mtime, (tmp_path / "back").stat().st_mtime
    assert when(standby.started_at) < diverted < when(state(tiny_fleet.production(), parked)["FinishedAt"])
    assert diverted < when(production.started_at) < back
    # Both hosts run what the definition says for each.
    code, out, err = tiny_fleet.cli("serve", NAME, "--diff", "--json")
    assert code == 0, out + err
    assert [(h["host"], h["clean"]) for h in json.loads(out)] == [("standby", True), ("production", True)]


def test_a_standby_that_fails_is_rolled_back_and_production_is_never_parked(tiny_fleet: Fleet,
                                                                            tmp_path: Path) -> None:
    # Two server starts: the standby's candidate (vLLM refuses its KV budget) and the standby's own container again.
    production = tiny_fleet.production().container(tiny_fleet.container)
    standby = tiny_fleet.standby().container(tiny_fleet.container)
    parked_before = parked(tiny_fleet)
    tiny_fleet.write(deploy=suite(tmp_path), standby_serve={"kv_cache_memory_bytes": KV_TOO_SMALL, "max_num_seqs": 1})
    code, out, err = tiny_fleet.cli("deploy", NAME, "--json")
    assert code != 0, out + err
    doc = json.loads(out)
    assert doc["halted_at"] == "standby" and not doc["deployed"] and not doc["diverted"]
    (step,) = doc["hosts"]
    assert step["host"] == "standby" and not step["deployed"]
    assert step.get("failed_check") or step["error"], step
    # The standby runs its old container again; production is the same container, never stopped.
    assert standby is not None and production is not None
    now = tiny_fleet.standby().container(tiny_fleet.container)
    assert now is not None and now.id == standby.id and now.status == "running"
    after = tiny_fleet.production().container(tiny_fleet.container)
    assert after is not None and (after.id, after.status, after.started_at) == (production.id, "running",
                                                                               production.started_at)
    assert parked(tiny_fleet) == parked_before
    assert not (tmp_path / "diverted").exists()
    code, out, _ = tiny_fleet.cli("deploy", NAME, "--host", "standby", "--status")
    assert code == 0 and "deploy of tiny: rolled-back" in out, out


def test_production_that_fails_is_rolled_back_while_the_standby_serves_the_new_image(tiny_fleet: Fleet,
                                                                                     tmp_path: Path) -> None:
    # Three server starts: the standby's candidate, production's (vLLM refuses its KV budget), production again.
    production = tiny_fleet.production().container(tiny_fleet.container)
    assert production is not None
    tiny_fleet.write(deploy=suite(tmp_path), production_serve={"kv_cache_memory_bytes": KV_TOO_SMALL})
    code, out, err = tiny_fleet.cli("deploy", NAME, "--json")
    assert code != 0, out + err
    doc = json.loads(out)
    assert doc["halted_at"] == "production" and doc["diverted"] and not doc["deployed"]
    standby_step, production_step = doc["hosts"]
    assert (standby_step["host"], standby_step["deployed"]) == ("standby", True)
    assert production_step["host"] == "production" and not production_step["deployed"]
    assert production_step.get("failed_check") or production_step["error"], production_step
    # Production is its old container again (started again by the rollback); the lane came back (after_switch).
    after = tiny_fleet.production().container(tiny_fleet.container)
    assert after is not None and after.id == production.id and after.status == "running"
    assert (tmp_path / "diverted").exists() and (tmp_path / "back").exists()
    # The standby still serves the new candidate: the one its deploy started, alive.
    standby = tiny_fleet.standby().container(tiny_fleet.container)
    assert standby is not None and standby.labels.get("io.vpatch.deploy") and standby.status == "running"
    code, out, err = tiny_fleet.cli("serve", NAME, "--check", "--host", "standby")
    assert code == 0, out + err
