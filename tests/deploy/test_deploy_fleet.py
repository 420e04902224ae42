"""`vpatch deploy` over two hosts on two real docker daemons (tests/helpers/fleet.py): a standby that fails is
rolled back and production is never parked; a production that fails is rolled back while the standby, which
answered a real request before the lane went to it, serves the new image. The deploy that succeeds, and its order
on the daemons' clocks, is docs/fleet.md's walk (tests/cli/test_doc_fleet.py). Each test here starts real servers:
the candidates, and what a rollback starts again (the count is in each test's comment)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from helpers.deployhost import KV_TOO_SMALL
from helpers.fleet import NAME, Fleet


def suite(marks: Path) -> dict[str, Any]:
    """A small suite (the KV pool, sized to each host's own budget) and the lane's hooks, which leave a file each."""
    return {"start_watch_s": 3, "health_timeout_s": 600, "request_timeout_s": 300,
            "checks": {"kv_pool": {"min_tokens": 1024, "max_drop": 0.9}},
            "hooks": {"before_switch": [["touch", str(marks / "diverted")]],
                      "after_switch": [["touch", str(marks / "back")]]}}


def parked(fleet: Fleet) -> set[str]:
    """Production's parked containers (earlier deploys leave theirs, stopped)."""
    found = fleet.production().client.api.containers(all=True, filters={"name": f"{fleet.container}-parked"})
    return {c["Id"] for c in found}


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
    assert code == 0 and "deploy of tiny on host standby: rolled-back" in out, out


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
    assert doc["answer"]["tokens"] == 8 and doc["answer"]["url"] == f"http://{tiny_fleet.daemon.address}:{tiny_fleet.port}"
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
