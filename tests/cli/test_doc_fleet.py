"""docs/fleet.md is a real run: its two-host walk is executed on the fleet of tests/helpers/fleet.py (two real docker
daemons, the standby over ssh, the real vLLM CPU server on each), with the page's own `hosts:` and `deploy:`
yaml. Every command's exit code and every output line the page quotes must be what the tool prints; the
deploy's order is then checked on the daemons' clocks and the lane hooks' files. Two server starts (the deploy's
candidates).

The page's rules (as docs/writing-a-patch.md's): in an indented block, `$ CMD` is run in the project folder
(`vpatch ...` as a child process, anything else by bash), `# exit N` after it is its exit code (0 when not
said), and the lines after it must appear in that order in what it printed (stdout, then stderr). Runs of
spaces count as one, and `...` in a line stands for any text.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import yaml
from helpers.fleet import Fleet

PAGE = Path(__file__).resolve().parents[2] / "docs" / "fleet.md"
_EXIT = re.compile(r"\s+#\s*exit (\d+)\s*$")
_FENCE = re.compile(r"^```yaml\n(.*?)^```", re.M | re.S)


@dataclass
class Step:
    line: int
    command: str
    exit_code: int
    expected: list[str] = field(default_factory=list)


def steps(page: str) -> list[Step]:
    found: list[Step] = []
    current: Step | None = None
    for number, raw in enumerate(page.splitlines(), 1):
        if not raw.startswith("    "):
            if raw.strip():
                current = None
            continue
        line = raw[4:]
        if line.startswith("$ "):
            code = _EXIT.search(line)
            command = _EXIT.sub("", line[2:]) if code else line[2:]
            current = Step(number, command, int(code[1]) if code else 0)
            found.append(current)
        elif current is not None:
            current.expected.append(line)
    return found


def squeeze(text: str) -> str:
    return re.sub(r"[ \t]+", " ", text).strip()


def pattern(line: str) -> re.Pattern[str]:
    return re.compile(".*?".join(re.escape(part) for part in squeeze(line).split("...")))


def check_output(step: Step, output: str) -> None:
    lines = [squeeze(ln) for ln in output.splitlines()]
    at = 0
    for want in step.expected:
        wanted = pattern(want)
        while at < len(lines) and not wanted.search(lines[at]):
            at += 1
        assert at < len(lines), f"docs/fleet.md:{step.line}: `{step.command}` printed no line {want!r} (in order):\n{output}"
        at += 1


def when(stamp: str) -> float:
    return datetime.fromisoformat(re.sub(r"(\.\d{6})\d*", r"\1", stamp).replace("Z", "+00:00")).timestamp()


def test_the_two_host_walk_is_what_the_tool_does(tiny_fleet: Fleet) -> None:
    page = PAGE.read_text(encoding="utf-8")
    # The page's endpoints are the fleet script's defaults; a machine that moved them runs the page with its own.
    page = page.replace("ssh://root@vpatch-fleet:2263", tiny_fleet.daemon.ssh).replace(
        "10.231.0.2", tiny_fleet.daemon.address)
    hosts_yaml, deploy_yaml = (yaml.safe_load(block) for block in _FENCE.findall(page))
    definition = yaml.safe_load(tiny_fleet.yaml_path.read_text())
    definition.update(hosts_yaml, **deploy_yaml)
    tiny_fleet.yaml_path.write_text(yaml.safe_dump(definition, sort_keys=False))
    before = tiny_fleet.production().container(tiny_fleet.container)
    assert before is not None

    env = {"CONTAINER": tiny_fleet.container}
    for step in steps(page):
        if step.command.startswith("vpatch "):
            code, out, err = tiny_fleet.cli(*shlex.split(step.command)[1:], cwd=tiny_fleet.root)
        else:
            code, out, err = tiny_fleet.shell(step.command, env=env)
        assert code == step.exit_code, f"docs/fleet.md:{step.line}: `{step.command}` exited {code}:\n{out}{err}"
        check_output(step, out + err)

    # The order the page tells: the standby's candidate started, the lane went to it, production was parked and
    # its candidate started, the lane came back.
    standby = tiny_fleet.standby().container(tiny_fleet.container)
    production = tiny_fleet.production().container(tiny_fleet.container)
    assert standby is not None and production is not None and production.id != before.id
    diverted = (tiny_fleet.root / "lane-on-standby").stat().st_mtime
    back = (tiny_fleet.root / "lane-on-production").stat().st_mtime
    parked = tiny_fleet.production().client.api.inspect_container(before.id)["State"]
    assert when(standby.started_at) < diverted < when(parked["FinishedAt"]) < when(production.started_at) < back
