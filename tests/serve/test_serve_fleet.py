"""`vpatch serve` over two hosts, on two real docker daemons: production on this machine's daemon (through a docker
context), the standby on a second daemon in its own network namespace, reached over ssh (tests/helpers/fleet.py).
Both run the real vLLM CPU server; the session starts them once (two server starts) and no test here starts more
unless one broke them."""

from __future__ import annotations

import json
import subprocess

from helpers.fleet import NAME, Fleet

from vpatch.serve import alive


def hosts_of(out: str) -> dict[str, dict]:
    return {item["host"]: item for item in json.loads(out)}


def test_each_host_runs_its_own_server_on_its_own_daemon_and_both_are_clean(tiny_fleet: Fleet) -> None:
    production = tiny_fleet.production().container(tiny_fleet.container)
    standby = tiny_fleet.standby().container(tiny_fleet.container)
    assert production is not None and standby is not None
    assert production.status == standby.status == "running" and production.id != standby.id
    # Each runs the serve section as its host says: the standby its own max_num_seqs.
    assert production.args[production.args.index("--max-num-seqs") + 1] == "2"
    assert standby.args[standby.args.index("--max-num-seqs") + 1] == "1"
    # Each answers on its own machine: production here, the standby in its network namespace, on the same port.
    assert alive.served_models(alive.base_url(tiny_fleet.port), timeout=10) == ["tiny"]
    assert alive.served_models(alive.base_url(tiny_fleet.port, tiny_fleet.daemon.address), timeout=10) == ["tiny"]

    code, out, err = tiny_fleet.cli("serve", NAME, "--diff", "--json")
    assert code == 0, out + err
    found = json.loads(out)
    assert [(h["host"], h["role"], h["clean"]) for h in found] == [("standby", "standby", True),
                                                                  ("production", "production", True)]
    assert found[0]["docker"] == tiny_fleet.daemon.ssh and "--max-num-seqs" in found[0]["args"]
    code, out, _ = tiny_fleet.cli("serve", NAME, "--diff")
    assert code == 0
    table = out.splitlines()
    assert table[0].split() == ["host", "role", "container", "runs", "drift"]
    assert table[1].startswith("standby") and table[1].endswith("clean")
    assert table[2].startswith("production") and table[2].endswith("clean")
    assert tiny_fleet.image in table[1] and "standby flags: /models/tiny-qwen3" in out


def test_a_hand_change_on_one_host_is_drift_on_that_host_only(tiny_fleet: Fleet) -> None:
    # An operator changes the standby's container by hand, over ssh as vpatch reaches it.
    subprocess.run(["docker", "--host", tiny_fleet.daemon.ssh, "update", "--restart", "always", tiny_fleet.container],
                   check=True, capture_output=True)
    try:
        code, out, err = tiny_fleet.cli("serve", NAME, "--diff", "--json")
        assert code == 7, out + err
        found = hosts_of(out)
        assert found["production"]["clean"] and found["production"]["drifts"] == []
        assert not found["standby"]["clean"]
        assert found["standby"]["drifts"] == [{"what": "restart policy", "yaml": "no", "running": "always"}]
        code, out, _ = tiny_fleet.cli("serve", NAME, "--diff")
        assert code == 7 and "standby: " + tiny_fleet.container + " differs from images/tiny.yaml:" in out
        assert "production: " not in out
    finally:
        subprocess.run(["docker", "--host", tiny_fleet.daemon.ssh, "update", "--restart", "no", tiny_fleet.container],
                       check=True, capture_output=True)

    # The definition moves for one host (the write-up's start script carried older values): that host drifts.
    tiny_fleet.write(standby_serve={"kv_cache_memory_bytes": 2 * 1024 * 1024, "max_num_seqs": 2})
    code, out, err = tiny_fleet.cli("serve", NAME, "--diff", "--json")
    assert code == 7, out + err
    found = hosts_of(out)
    assert found["production"]["clean"]
    assert found["standby"]["drifts"] == [{"what": "--max-num-seqs", "yaml": "2", "running": "1"}]


def test_an_unreachable_host_is_an_error_before_anything_is_touched(tiny_fleet: Fleet) -> None:
    before = {which: docker.container(tiny_fleet.container) for which, docker in
              (("production", tiny_fleet.production()), ("standby", tiny_fleet.standby()))}
    # Nothing listens on the standby's port: `serve --replace` would replace the standby first, then production.
    tiny_fleet.write(standby_docker="ssh://root@vpatch-fleet:1")
    code, _, err = tiny_fleet.cli("serve", NAME, "--replace")
    assert code != 0
    assert "error: the docker daemon of host standby (ssh://root@vpatch-fleet:1) is not reachable" in err, err
    code, _, err = tiny_fleet.cli("serve", NAME, "--diff")
    assert code != 0 and "host standby" in err
    # Production's context names no daemon: every host is reached before the first is touched.
    tiny_fleet.write()
    tiny_fleet.yaml_path.write_text(tiny_fleet.yaml_path.read_text().replace("vpatch-fleet-production",
                                                                              "vpatch-fleet-gone"))
    code, _, err = tiny_fleet.cli("serve", NAME, "--replace")
    assert code != 0 and "host production: no docker context 'vpatch-fleet-gone'" in err, err
    after = {which: docker.container(tiny_fleet.container) for which, docker in
             (("production", tiny_fleet.production()), ("standby", tiny_fleet.standby()))}
    for which, info in after.items():
        assert info is not None and before[which] is not None
        assert (info.id, info.status, info.started_at) == (before[which].id, "running", before[which].started_at)


def test_one_host_by_name(tiny_fleet: Fleet) -> None:
    code, out, err = tiny_fleet.cli("serve", NAME, "--diff", "--json", "--host", "standby")
    assert code == 0, out + err
    assert [(h["host"], h["clean"]) for h in json.loads(out)] == [("standby", True)]
    code, out, _ = tiny_fleet.cli("serve", NAME, "--print", "--host", "standby")
    assert out.splitlines()[1].startswith(f"docker --host {tiny_fleet.daemon.ssh} run --detach")
    code, out, err = tiny_fleet.cli("serve", NAME, "--check", "--host", "standby")
    assert code == 0 and out.startswith(f"standby: {tiny_fleet.container} (running"), out + err
    code, _, err = tiny_fleet.cli("serve", NAME, "--diff", "--host", "gpu-9")
    assert code != 0 and "no host 'gpu-9' (its hosts: production, standby)" in err
