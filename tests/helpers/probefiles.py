"""Probe files for the toy upstream: a command probe and its script, and 0001 in a project with that probe."""

from __future__ import annotations

from pathlib import Path

from conftest import KV_FIXED, Project

from vpatch.probes.file import Probe
from vpatch.series.files import Patch

# Exit 0 when the tree skips null blocks, 1 when it stops at them; counts its runs next to itself.
SCRIPT = """\
import pathlib, sys
with open(pathlib.Path(__file__).with_name("runs.log"), "a") as log:
    log.write("run\\n")
text = pathlib.Path("vllm/kv.py").read_text()
print("kv.py says", "continue" if "continue" in text else "break")
sys.exit(0 if "continue" in text else 1)
"""

COMMAND_PROBE = """\
kind: command
run: ["{python}", "{probe_dir}/check.py"]
timeout: 60
"""


def write_probe(folder: Path, yaml_text: str, script: str | None = None, name: str = "probe.yaml") -> Probe:
    folder.mkdir(parents=True, exist_ok=True)
    if script is not None:
        (folder / "check.py").write_text(script)
    (folder / name).write_text(yaml_text)
    return Probe.load(folder / name)


def project_patch(project: Project, probe_yaml: str, script: str | None = None) -> Patch:
    """0001-kv-skip-null in the project, its probe (`probe_yaml`, `script`) under patches/probes/."""
    path = project.make_patch(1, "kv-skip-null", {"vllm/kv.py": KV_FIXED}, "kv: skip null blocks",
                              trailers="Origin: vendor\nProbe: probes/0001-kv-skip-null.yaml\nLast-Update: 2026-09-01")
    write_probe(project.patches / "probes", probe_yaml, script, name="0001-kv-skip-null.yaml")
    return Patch.load(path)
