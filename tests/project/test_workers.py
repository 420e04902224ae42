"""Two xdist workers never share a port, a container name or a state folder: a real `pytest -n 2` run in which
each worker takes what the serve and deploy tests take (tests/helpers/serverimage.py, tmp_path_factory), and says what."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

# Run by every worker (--dist each): the ports, names and folders a server test takes, written down.
_TAKE = '''
import json, os
from pathlib import Path
import pytest
from helpers.serverimage import free_port, unique_name, worker

@pytest.mark.parametrize("i", range(6))
def test_take(i, tmp_path, tmp_path_factory):
    state = tmp_path_factory.mktemp("deploy-state")
    out = {"worker": worker(), "ports": [free_port() for _ in range(5)], "names": [unique_name("vpatch-deploy-test")],
           "folders": [str(state), str(tmp_path)]}
    Path(os.environ["TAKEN"], f"{worker()}-{i}.json").write_text(json.dumps(out))
'''


def test_two_workers_take_disjoint_ports_names_and_state_folders(tmp_path: Path) -> None:
    run = tmp_path / "run"
    taken = tmp_path / "taken"
    run.mkdir()
    taken.mkdir()
    (run / "test_take.py").write_text(_TAKE)
    env = {**os.environ, "PYTHONPATH": str(TESTS), "TAKEN": str(taken)}
    env.pop("PYTEST_XDIST_WORKER", None)  # this test may itself run on a worker
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "each", "-p", "no:cacheprovider",
                           "--basetemp", str(tmp_path / "base"), str(run)],
                          cwd=run, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    by_worker: dict[str, dict[str, set[str]]] = {}
    for path in taken.glob("*.json"):
        got = json.loads(path.read_text())
        mine = by_worker.setdefault(got["worker"], {"ports": set(), "names": set(), "folders": set()})
        for kind in mine:
            values = {str(v) for v in got[kind]}
            assert not values & mine[kind], f"{got['worker']} took a {kind[:-1]} twice: {values & mine[kind]}"
            mine[kind] |= values
    assert sorted(by_worker) == ["gw0", "gw1"], done.stdout
    gw0, gw1 = by_worker["gw0"], by_worker["gw1"]
    for kind in ("ports", "names", "folders"):
        assert len(gw0[kind]) == len(gw1[kind]) > 0
        assert not gw0[kind] & gw1[kind], f"both workers took the {kind}: {gw0[kind] & gw1[kind]}"
    # and no worker's folder lies in the other's
    assert not any(a.startswith(b) or b.startswith(a) for a in gw0["folders"] for b in gw1["folders"])


# Skips every test at setup, writing down which worker was given it and its xdist groups: the scheduling of the
# real suite, without running it.
_WHERE = '''
import json, os
from pathlib import Path
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                     for m in item.iter_markers("xdist_group")})
    with open(Path(os.environ["WHERE"]), "a") as out:
        out.write(json.dumps({"worker": os.environ["PYTEST_XDIST_WORKER"], "groups": groups, "test": item.nodeid}) + "\\n")
    pytest.skip("scheduling only")
'''


def test_every_xdist_group_of_the_suite_runs_on_one_worker(tmp_path: Path) -> None:
    """The README's `-n 2 --dist loadgroup` over the serve and deploy tests: each group (the real vLLM server's
    above all) is given to one worker, so two servers never load at once. pytest 9.2 with xdist 3.8 broke this
    without a word (every group split over both workers)."""
    (tmp_path / "where_plugin.py").write_text(_WHERE)
    where = tmp_path / "where.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(TESTS)]), "WHERE": str(where)}
    env.pop("PYTEST_XDIST_WORKER", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p", "where_plugin",
                           "-p", "no:cacheprovider", str(TESTS / "serve"), str(TESTS / "deploy")],
                          cwd=TESTS.parent, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in where.read_text().splitlines()]
    workers_of: dict[str, set[str]] = {}
    for row in rows:
        for group in row["groups"]:
            workers_of.setdefault(group, set()).add(row["worker"])
    assert {row["worker"] for row in rows} == {"gw0", "gw1"}, "one worker ran everything: nothing to tell"
    assert "vllm-server" in workers_of, sorted(workers_of)
    split = {group: sorted(workers) for group, workers in workers_of.items() if len(workers) > 1}
    assert not split, f"xdist groups split over workers: {split}"
