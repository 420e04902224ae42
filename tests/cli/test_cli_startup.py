"""CLI start-up: `vpatch status --help` stays small (counted in modules, not timed) and every --help works."""

from __future__ import annotations

import json
import subprocess
import sys

from typer.testing import CliRunner

from vpatch.commands.cli import app

# Measured with typer 0.28: 318 modules for `vpatch status --help` (typer 0.29 with pydantic: 418).
# The ceiling leaves room for vpatch's own growth, not for another library the size of pydantic.
MODULE_CEILING = 360

_COUNT = """
import contextlib, io, json, sys
from vpatch.commands.cli import main
sys.argv = ["vpatch", "status", "--help"]
out = io.StringIO()
code = 0
try:
    with contextlib.redirect_stdout(out):
        main()
except SystemExit as exc:
    code = exc.code or 0
tops = sorted({m.split(".")[0] for m in sys.modules})
print(json.dumps({"code": code, "count": len(sys.modules), "tops": tops, "help": out.getvalue()}))
"""


def test_status_help_imports_no_validation_library_and_few_modules() -> None:
    proc = subprocess.run([sys.executable, "-c", _COUNT], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["code"] == 0 and "--against" in seen["help"]
    assert "pydantic" not in seen["tops"]
    # --help reads no config and talks to no daemon: those libraries load when a command needs them.
    assert not {"docker", "requests", "yaml"} & set(seen["tops"])
    assert seen["count"] <= MODULE_CEILING, f"{seen['count']} modules: {seen['tops']}"


def test_every_command_has_working_help() -> None:
    runner = CliRunner()
    top = runner.invoke(app, ["--help"])
    assert top.exit_code == 0, top.output
    names = [c.name for c in app.registered_commands if c.name] + [
        c.callback.__name__.replace("_", "-") for c in app.registered_commands if not c.name and c.callback
    ]
    assert "status" in names and len(names) >= 8
    for name in names:
        result = runner.invoke(app, [name, "--help"])
        assert result.exit_code == 0, f"vpatch {name} --help: {result.output}"
        assert "Usage:" in result.output
