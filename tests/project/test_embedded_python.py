"""Python written inside shell scripts (.ci/run's heredocs) imports what vpatch has: a move of a module shows
here, not as a CI setup that fails before the tests run (the folder re-layout broke .ci/run's probe venv step)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEREDOC = re.compile(r"python3? - <<'?(\w+)'?\n(.*?)\n\1\n", re.S)


def shell_scripts() -> list[Path]:
    found = [ROOT / ".ci" / "run"]
    for path in sorted((ROOT / "scripts").iterdir()):
        if path.is_file() and path.read_bytes()[:2] == b"#!" and b"python" not in path.read_bytes().split(b"\n")[0]:
            found.append(path)
    return found


def embedded(path: Path) -> list[str]:
    return [m.group(2) for m in HEREDOC.finditer(path.read_text(encoding="utf-8"))]


def vpatch_imports(code: str) -> list[tuple[str, tuple[str, ...]]]:
    found = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "vpatch":
            found.append((node.module, tuple(a.name for a in node.names)))
        elif isinstance(node, ast.Import):
            found += [(a.name, ()) for a in node.names if a.name.split(".")[0] == "vpatch"]
    return found


def test_ci_run_has_embedded_python() -> None:
    assert embedded(ROOT / ".ci" / "run"), "the pattern no longer finds .ci/run's python heredocs"


@pytest.mark.parametrize("script", shell_scripts(), ids=lambda p: str(p.relative_to(ROOT)))
def test_embedded_python_imports_what_vpatch_has(script: Path) -> None:
    missing = []
    for code in embedded(script):
        for module, names in vpatch_imports(code):
            loaded = importlib.import_module(module)
            missing += [f"{module}.{n}" for n in names
                        if not hasattr(loaded, n) and importlib.util.find_spec(f"{module}.{n}") is None]
    assert not missing, f"{script.relative_to(ROOT)} imports names vpatch does not have: {missing}"


def test_the_check_sees_a_moved_module() -> None:
    code = embedded(ROOT / ".ci" / "run")[0] + "\nfrom vpatch import probe_env\n"
    imports = vpatch_imports(code)
    assert ("vpatch", ("probe_env",)) in imports
    loaded = importlib.import_module("vpatch")
    assert not hasattr(loaded, "probe_env") and importlib.util.find_spec("vpatch.probe_env") is None
