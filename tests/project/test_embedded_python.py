"""Python written inside shell scripts (.ci/run's heredocs) imports what vpatch has: a move of a module shows
here, not as a CI setup that fails before the tests run (the folder re-layout broke .ci/run's probe venv step).
And no Python program is kept in a string in src/: code another interpreter runs is a module, run by path."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import sys
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


# --- no program in a string: code that runs in another interpreter is a .py file of the package, run by path -----

SRC = ROOT / "src" / "vpatch"
CHILD = SRC / "probes" / "child"
# Programs still kept in a string, each with the room that owns it and why it stays; the test fails on an entry no
# longer found, so the list only shrinks. (The last two, run by an image's python3 in a container, became
# serve/vllm_flags.py and image/find_vllm.py, handed to it whole as serve/alive.py is.)
KNOWN_PROGRAMS: dict[str, str] = {}


def literal_text(node: ast.AST) -> str | None:
    """The text of a string literal, or of literals joined with +; None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = literal_text(node.left), literal_text(node.right)
        return left + right if left is not None and right is not None else None
    return None


def is_program(text: str) -> bool:
    """Text that parses as Python and imports, defines a function or a class: a program, whatever runs it."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    return any(isinstance(n, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
               for n in ast.walk(tree))


def string_programs(path: Path, rel: Path) -> list[str]:
    """Where `path` keeps a program in a string: `file:NAME` for a module-level name bound to one, `file:line`
    for any other literal (the arguments of a call, a default). Docstrings are prose, not checked."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and (body := node.body) and isinstance(body[0], ast.Expr)}
    found: list[str] = []
    named: set[int] = set()
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for value in ast.walk(node.value):
                text = literal_text(value)
                if text is not None and is_program(text):
                    found += [f"{rel}:{t.id}" for t in targets if isinstance(t, ast.Name)]
                    named.update(id(n) for n in ast.walk(node.value))
                    break
    for node in ast.walk(tree):
        if id(node) in named or id(node) in docstrings:
            continue
        text = literal_text(node)
        if text is not None and is_program(text) and not isinstance(node, ast.BinOp):
            found.append(f"{rel}:{node.lineno}")
    return sorted(set(found))


def all_string_programs(src: Path) -> list[str]:
    return [hit for path in sorted(src.rglob("*.py"))
            for hit in string_programs(path, path.relative_to(src.parent.parent))]


def test_no_program_is_kept_in_a_string() -> None:
    found = all_string_programs(SRC)
    new = [hit for hit in found if hit not in KNOWN_PROGRAMS]
    assert not new, f"Python programs kept in strings (make each a .py file of the package, run by path): {new}"
    gone = [known for known in KNOWN_PROGRAMS if known not in found]
    assert not gone, f"no longer a program in a string: remove from KNOWN_PROGRAMS: {gone}"


def test_the_check_sees_a_program_in_a_string(tmp_path: Path) -> None:
    src = tmp_path / "src" / "vpatch"
    src.mkdir(parents=True)
    (src / "mod.py").write_text(
        '"""import os"""\n\n'  # a docstring: prose, even when it parses
        'HEAD = r"""\nimport os\n"""\n'
        'SERVER = HEAD + """\ndef serve():\n    pass\n"""\n'
        'MESSAGE = "import the module first"\n'
        'def run(argv):\n    return ["python", "-c", "import sys; print(sys.path)", *argv]\n', encoding="utf-8")
    assert all_string_programs(src) == ["src/vpatch/mod.py:12", "src/vpatch/mod.py:HEAD", "src/vpatch/mod.py:SERVER"]


# What a child program may import beyond the standard library: what it runs, which its interpreter must have.
RUNS_WITH = {("upstream_tests.py", "pytest")}


def test_the_child_programs_import_the_standard_library_and_each_other_only() -> None:
    # they run by path in the probe venv, where vpatch is not installed: its imports are for the type checker only
    siblings = {p.stem for p in CHILD.glob("*.py")}
    bad = []
    for path in sorted(CHILD.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        checking = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and ast.unparse(node.test) ==
                    "TYPE_CHECKING" for stmt in node.body for n in ast.walk(stmt)}
        for node in ast.walk(tree):
            if id(node) in checking:
                continue
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            bad += [f"{path.name}: {n}" for n in names
                    if n.split(".")[0] not in sys.stdlib_module_names and n.split(".")[0] not in siblings
                    and n != "__future__" and (path.name, n.split(".")[0]) not in RUNS_WITH]
    assert not bad, f"a child program imports what the probe venv does not have: {bad}"
