"""The import graph: every import in src/vpatch points down the layers of docs/architecture.md, and no module
imports a `_private` name from another. Read from the source with `ast`: nothing is imported or run."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

# Known violations, each removed by work in flight. The lead deletes this allowlist when those branches
# merge; the tests below also fail on an entry that no longer occurs, so it can only shrink.
KNOWN_VIOLATIONS: dict[tuple[str, str], str] = {
    # (importing module, imported name) -> the work that removes it
}


@dataclass(frozen=True)
class Import:
    file: Path
    line: int
    importer: str  # the importing module, dotted ("vpatch.update.run", "test_update")
    target: str  # the module imported from ("vpatch.git"), resolved for relative imports
    names: tuple[str, ...]  # the names of `from target import a, b`; () for `import target`

    @property
    def where(self) -> str:
        return f"{self.file.relative_to(ROOT)}:{self.line}"


def module_name(path: Path, base: Path) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, base: Path) -> Iterator[Import]:
    """Every import statement in one file: top level, inside functions, under TYPE_CHECKING alike."""
    importer = module_name(path, base)
    package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(path, node.lineno, importer, alias.name, ())
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*anchor, *([target] if target else [])])
            yield Import(path, node.lineno, importer, target, tuple(a.name for a in node.names))


def vpatch_modules() -> set[str]:
    return {module_name(p, SRC) for p in (SRC / "vpatch").rglob("*.py")}


def python_files() -> Iterator[tuple[Path, Path]]:
    """(file, the folder its module names are relative to) for src/, tests/ and the Python scripts."""
    for path in sorted((SRC / "vpatch").rglob("*.py")):
        yield path, SRC
    for path in sorted((ROOT / "tests").rglob("*.py")):
        yield path, ROOT / "tests"
    for path in sorted((ROOT / "scripts").iterdir()):
        if path.is_file() and (path.suffix == ".py" or path.read_bytes().startswith(b"#!/usr/bin/env python")):
            yield path, ROOT / "scripts"


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


# --- the layers, as docs/architecture.md writes them down ---------------------------------------------


def layers() -> list[tuple[str, list[str]]]:
    """(layer, module patterns) from the table under "## The layers", top first."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text.split("\n## The layers\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| Layer ")]
    table = []
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        table.append((cells[0], re.findall(r"`([^`]+)`", cells[1])))
    assert len(table) > 5, f"no layer table found in {ARCHITECTURE}"
    return table


def layer_of(module: str, table: list[tuple[str, list[str]]]) -> int | None:
    """The index (0 = top) of the layer holding `module`; the most specific pattern wins."""
    best: tuple[int, int] | None = None  # (specificity, layer)
    name = module.removeprefix("vpatch.") if module != "vpatch" else "vpatch"
    for index, (_, patterns) in enumerate(table):
        for pattern in patterns:
            if pattern.endswith(".*"):
                prefix = pattern[:-2]
                if name == prefix or name.startswith(prefix + "."):
                    score = len(prefix)
                else:
                    continue
            elif name == pattern:
                score = len(pattern) + 1000  # an exact name beats any package
            else:
                continue
            if best is None or score > best[0]:
                best = (score, index)
    return None if best is None else best[1]


def resolve(target: str, names: tuple[str, ...], modules: set[str]) -> list[str]:
    """The vpatch modules an import depends on: `from vpatch import git` is vpatch.git, not the package."""
    if target != "vpatch" and not target.startswith("vpatch."):
        return []
    found = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
    if len(found) < len(names) or not names:
        found.append(target)  # some names are attributes of the module `target` itself
    return found


def test_every_module_has_a_layer() -> None:
    table = layers()
    missing = sorted(m for m in vpatch_modules() if layer_of(m, table) is None)
    assert not missing, f"modules without a layer: {missing}; give each a row in {ARCHITECTURE.relative_to(ROOT)}"


def test_every_import_points_down_the_layers() -> None:
    table, modules = layers(), vpatch_modules()
    upward, seen = [], set()
    for path, base in python_files():
        if base != SRC:
            continue
        for imp in imports(path, base):
            here = layer_of(imp.importer, table)
            assert here is not None, imp.importer
            for dependency in resolve(imp.target, imp.names, modules):
                there = layer_of(dependency, table)
                if there is None or there >= here:
                    continue
                if (imp.importer, dependency) in KNOWN_VIOLATIONS:
                    seen.add((imp.importer, dependency))
                    continue
                upward.append(f"{imp.where}: {imp.importer} ({table[here][0]}) imports {dependency} "
                              f"({table[there][0]}, above it)")
    assert not upward, "imports pointing up the layers of docs/architecture.md:\n" + "\n".join(upward)
    stale = {k for k in KNOWN_VIOLATIONS if not is_private(k[1].rpartition(".")[2])} - seen
    assert not stale, f"allowlisted upward imports that are gone (delete them from KNOWN_VIOLATIONS): {sorted(stale)}"


def test_no_module_imports_a_private_name_of_another() -> None:
    found, seen = [], set()
    for path, base in python_files():
        for imp in imports(path, base):
            parts = imp.target.split(".")
            private = [imp.target] if any(is_private(p) for p in parts) else []
            private += [f"{imp.target}.{n}" for n in imp.names if is_private(n)]
            for name in private:
                if (imp.importer, name) in KNOWN_VIOLATIONS:
                    seen.add((imp.importer, name))
                    continue
                found.append(f"{imp.where}: {imp.importer} imports {name}")
    assert not found, "private names imported from another module (make them public, or move the code):\n" + "\n".join(found)
    stale = {k for k in KNOWN_VIOLATIONS if is_private(k[1].rpartition(".")[2])} - seen
    assert not stale, f"allowlisted private imports that are gone (delete them from KNOWN_VIOLATIONS): {sorted(stale)}"


def test_test_modules_import_no_other_test_module() -> None:
    """Shared test code lives in tests/helpers/ or conftest.py: a test module is never a library."""
    found = [f"{imp.where}: {imp.importer} imports {imp.target}" for path, base in python_files() if base == ROOT / "tests"
             for imp in imports(path, base) if imp.target.split(".")[0].startswith("test_")]
    assert not found, "test modules importing test modules (move the shared code to tests/helpers/):\n" + "\n".join(found)


def test_the_checks_see_a_violation(tmp_path: Path) -> None:
    """The checks can fail: an upward and a private import in a module written here are both found."""
    (tmp_path / "vpatch").mkdir()
    (tmp_path / "vpatch" / "git.py").write_text(
        "from vpatch import update\nfrom vpatch.update.run import _run\nfrom . import errors\n")
    table = layers()
    found = list(imports(tmp_path / "vpatch" / "git.py", tmp_path))
    assert [(i.target, i.names) for i in found] == [("vpatch", ("update",)), ("vpatch.update.run", ("_run",)),
                                                    ("vpatch", ("errors",))]
    modules = vpatch_modules()
    git_layer = layer_of("vpatch.git", table)
    assert git_layer is not None
    up = [d for i in found for d in resolve(i.target, i.names, modules) if (layer_of(d, table) or 0) < git_layer]
    assert up == ["vpatch.update", "vpatch.update.run"]
    assert is_private(found[1].names[0]) and not is_private("__future__")
    assert layer_of("vpatch.docker.containers", table) == git_layer != layer_of("vpatch.image.build", table)
    assert layer_of("vpatch.config.serve", table) != layer_of("vpatch.serve.run", table)  # the exact name wins


# --- the git door: only vpatch/git/ builds git command lines ----------------------------------------

GIT_DOOR = ("vpatch.git", "vpatch.git.catfile")  # the package, and its long-lived object reader


def in_git_door(module: str) -> bool:
    return any(module == door or module.startswith(door + ".") for door in GIT_DOOR)


def git_argv_calls(path: Path, base: Path, *, literal: bool = True) -> Iterator[str]:
    """Where a module hands git an argv of its own: `git.run(repo, [...])` (or the runner imported by name),
    and, with `literal`, any call with a list or tuple argument starting with "git" (process.run(["git", ...]))."""
    module = module_name(path, base)
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    git_names, runner_names = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("vpatch", "vpatch.git", "vpatch.git.core"):
            for alias in node.names:
                if node.module == "vpatch" and alias.name == "git":
                    git_names.add(alias.asname or "git")
                elif node.module != "vpatch" and alias.name in ("run", "command"):
                    runner_names.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in ("vpatch.git", "vpatch.git.core") and alias.asname:
                    git_names.add(alias.asname)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        to_runner = (isinstance(func, ast.Attribute) and func.attr in ("run", "command")
                     and isinstance(func.value, ast.Name) and func.value.id in git_names) or \
                    (isinstance(func, ast.Name) and func.id in runner_names)
        argv_first_git = any(isinstance(a, (ast.List, ast.Tuple)) and a.elts and isinstance(a.elts[0], ast.Constant)
                             and a.elts[0].value == "git" for a in node.args)
        if to_runner or (literal and argv_first_git):
            yield f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{node.lineno}: {module} " \
                  f"runs git with an argv of its own"


def test_only_the_git_door_builds_git_command_lines() -> None:
    """Every git command vpatch runs has a function named by its intent in vpatch/git/; no other module of
    src/ writes a git argv, and no script hands one to vpatch's git runner. (Tests may: they set up
    repositories. Scripts may run plain git as a user or a baseline would: bench-status times git itself.)"""
    found = [hit for path, base in python_files() if base != ROOT / "tests"
             and not (base == SRC and in_git_door(module_name(path, base)))
             for hit in git_argv_calls(path, base, literal=base == SRC)]
    assert not found, "git command lines outside vpatch/git/ (add an intent-named function there):\n" + "\n".join(found)


def test_the_git_door_check_sees_a_raw_call(tmp_path: Path) -> None:
    (tmp_path / "vpatch").mkdir()
    module = tmp_path / "vpatch" / "stack.py"
    module.write_text("from vpatch import git\nfrom vpatch import process\nfrom vpatch.git import run as g\n"
                      "git.run(repo, ['log'])\nprocess.run(('git', 'status'), cwd=repo)\ng(repo, ['x'])\n"
                      "git.commit_subject(repo, 'HEAD')\nprocess.run(['docker', 'ps'])\n")
    assert [hit.split(": ", 1)[0].rsplit(":", 1)[1] for hit in git_argv_calls(module, tmp_path)] == ["4", "5", "6"]
