"""The import graph of src/vpatch: the rooms are its folders, in the order of docs/architecture.md's table;
every import points down the rooms and reaches another room through its face (its `__init__`); module-level
imports form no circle; an import inside a function says why; no module imports a `_private` name from another.
Read from the source with `ast`: nothing is imported or run."""

from __future__ import annotations

import ast
import functools
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

# Known private imports, each removed by work in flight; the test also fails on an entry that no longer
# occurs, so the list can only shrink.
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
    where_in: str = "top"  # "top": runs when the module loads; "typing": under TYPE_CHECKING; "function": inside one
    reason: str | None = None  # a function-level import's `# lazy: <reason>` comment

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
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()

    def visit(node: ast.AST, where_in: str) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            inner = where_in
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                inner = "function"
            elif isinstance(child, ast.If) and where_in == "top" and "TYPE_CHECKING" in ast.unparse(child.test):
                yield from (i for c in child.body for i in visit_one(c, "typing"))
                yield from (i for c in child.orelse for i in visit_one(c, where_in))
                continue
            yield from visit_one(child, inner)

    def visit_one(node: ast.AST, where_in: str) -> Iterator[Import]:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            comment = lines[node.lineno - 1].partition("# lazy:")[2].strip() or None
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield Import(path, node.lineno, importer, alias.name, (), where_in, comment)
            else:
                target = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join([*anchor, *([target] if target else [])])
                yield Import(path, node.lineno, importer, target, tuple(a.name for a in node.names), where_in, comment)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            where_in = "function"
        yield from visit(node, where_in)

    yield from visit(ast.parse(source, str(path)), "top")


def vpatch_modules(src: Path = SRC) -> set[str]:
    return {module_name(p, src) for p in (src / "vpatch").rglob("*.py")}


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


def resolve(target: str, names: tuple[str, ...], modules: set[str]) -> list[str]:
    """The vpatch modules an import depends on: `from vpatch import git` is vpatch.git, not the package."""
    if target != "vpatch" and not target.startswith("vpatch."):
        return []
    found = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
    if len(found) < len(names) or not names:
        found.append(target)  # some names are attributes of the module `target` itself
    return found


# --- the rooms: the folders of src/vpatch, in the order docs/architecture.md writes them down -----------

# Imports of another room's inner module, each with the reason it stays; the test fails on an entry no longer
# seen, so the list only shrinks.
KNOWN_INNER: dict[tuple[str, str], str] = {}


# Circles through imports that do not run when a module loads (under TYPE_CHECKING, or inside a function).
KNOWN_CIRCLES: dict[str, set[frozenset[str]]] = {
    "typing": {
        frozenset({"vpatch.probes.file", "vpatch.probes.outcome"}),
        frozenset({"vpatch.probes.runner", "vpatch.probes.workspace"}),
        frozenset({"vpatch.update.plan", "vpatch.update.retarget"}),
    },
    "function": {
        frozenset({"vpatch.probes.file", "vpatch.probes.outcome"}),
        frozenset({"vpatch.probes.runner", "vpatch.probes.workspace"}),
        frozenset({"vpatch.update.plan", "vpatch.update.retarget"}),
    },
}

# Imports inside functions without a `# lazy:` reason, per module: each one moves to the top or gets its
# reason. The test fails when a module has more than listed, or fewer (lower the count then).
KNOWN_UNEXPLAINED: dict[str, int] = {
}


def room_folders(src: Path = SRC) -> list[str]:
    return sorted(p.name for p in (src / "vpatch").iterdir() if (p / "__init__.py").is_file())


def room_order(text: str | None = None) -> list[str]:
    """The rooms, top first, from the table under "## The rooms"."""
    text = ARCHITECTURE.read_text(encoding="utf-8") if text is None else text
    section = text.split("\n## The rooms\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    order = [re.findall(r"`([^`]+)`", row.split("|")[1])[0] for row in rows]
    assert order, f"no table of rooms found in {ARCHITECTURE}"
    return order


def room_of(module: str) -> str:
    """`vpatch.probes.file` is in probes; the two files beside the rooms count as the end rooms."""
    parts = module.split(".")
    if len(parts) == 1:
        return "base"
    return "commands" if parts[1] == "__main__" else parts[1]


def faces_importing_their_room(src: Path) -> set[str]:
    """The rooms whose face imports one of their own modules: no module of such a room may import the face."""
    found = set()
    for room in room_folders(src):
        for imp in imports(src / "vpatch" / room / "__init__.py", src):
            if imp.target.startswith(f"vpatch.{room}.") or (imp.target == f"vpatch.{room}" and imp.names):
                found.add(room)
    return found


@dataclass(frozen=True)
class Finding:
    kind: str  # "upward", "inner", "own face"
    importer_room: str
    dependency: str
    text: str


def findings(src: Path, order: list[str]) -> Iterator[Finding]:
    """Every import of src/vpatch that points up the rooms, reaches another room's inner module, or imports its
    own room's face (where that face imports the room's modules)."""
    modules, rank = vpatch_modules(src), {room: i for i, room in enumerate(order)}
    guarded = faces_importing_their_room(src)
    for path in sorted((src / "vpatch").rglob("*.py")):
        for imp in imports(path, src):
            here = room_of(imp.importer)
            where = f"{path.relative_to(src.parent) if path.is_relative_to(src.parent) else path}:{imp.line}"
            for dependency in resolve(imp.target, imp.names, modules):
                there = room_of(dependency)
                if rank[there] < rank[here]:
                    yield Finding("upward", here, dependency, f"{where}: {imp.importer} ({here}) imports {dependency} "
                                  f"({there}, above it)")
                elif there != here and dependency not in (f"vpatch.{there}", "vpatch"):
                    yield Finding("inner", here, dependency, f"{where}: {imp.importer} ({here}) imports {dependency}, "
                                  f"an inner module of {there}: import its names from vpatch.{there}")
                elif there == here and dependency == f"vpatch.{here}" and here in guarded \
                        and not path.name == "__init__.py":
                    yield Finding("own face", here, dependency, f"{where}: {imp.importer} imports its own room's face "
                                  f"{dependency}: import the sibling module instead")


def test_every_folder_has_a_row_and_every_row_a_folder() -> None:
    order, folders = room_order(), room_folders()
    assert len(order) == len(set(order)), f"a room listed twice in {ARCHITECTURE.relative_to(ROOT)}: {order}"
    assert sorted(order) == folders, (f"rows without a folder: {sorted(set(order) - set(folders))}; "
                                      f"folders without a row: {sorted(set(folders) - set(order))}")


def test_imports_point_down_the_rooms_and_through_their_faces() -> None:
    found = list(findings(SRC, room_order()))
    known = KNOWN_INNER
    bad = [f.text for f in found if f.kind != "inner" or (f.importer_room, f.dependency) not in known]
    assert not bad, "imports against docs/architecture.md's rooms:\n" + "\n".join(bad)
    stale = set(known) - {(f.importer_room, f.dependency) for f in found}
    assert not stale, f"known inner imports that are gone (delete them from KNOWN_INNER): {sorted(stale)}"


def test_a_face_holds_what_it_exports_and_shadows_no_module() -> None:
    for room in room_folders():
        face = SRC / "vpatch" / room / "__init__.py"
        tree = ast.parse(face.read_text(encoding="utf-8"))
        exported = next((set(ast.literal_eval(n.value)) for n in tree.body if isinstance(n, ast.Assign)
                         and getattr(n.targets[0], "id", "") == "__all__"), set())
        missing = {name for name in exported if not any(
            isinstance(n, (ast.ImportFrom, ast.ClassDef, ast.FunctionDef, ast.Assign)) and name in ast.unparse(n) for n in tree.body)}
        assert not missing, f"{face.relative_to(ROOT)}: __all__ names what it does not hold: {sorted(missing)}"
        modules = {p.stem for p in face.parent.glob("*.py")} | {p.name for p in face.parent.iterdir() if p.is_dir()}
        assert not exported & modules, f"{face.relative_to(ROOT)} exports names of its modules: {sorted(exported & modules)}"



def lazy_exports(face: Path) -> dict[str, tuple[str, str]]:
    """A face's `_LAZY` table (name -> (module, name there)): the names it loads on first use (PEP 562)."""
    tree = ast.parse(face.read_text(encoding="utf-8"))
    return next((ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.AnnAssign | ast.Assign)
                 and getattr(n.targets[0] if isinstance(n, ast.Assign) else n.target, "id", "") == "_LAZY"
                 and n.value is not None), {})


def test_a_lazy_export_is_typed_and_loads_only_when_used() -> None:
    """A name a face loads on first use is in its __all__, imported under TYPE_CHECKING from the module `_LAZY` names
    (what mypy reads), is that module's object when used, and importing the face loads none of those modules."""
    faces = {room: SRC / "vpatch" / room / "__init__.py" for room in room_folders()}
    lazy = {room: table for room, face in faces.items() if (table := lazy_exports(face))}
    assert set(lazy) >= {"base", "report", "upstream"}, f"faces with lazy exports: {sorted(lazy)}"
    for room, table in lazy.items():
        face = faces[room]
        tree = ast.parse(face.read_text(encoding="utf-8"))
        exported = next(set(ast.literal_eval(n.value)) for n in tree.body if isinstance(n, ast.Assign)
                        and getattr(n.targets[0], "id", "") == "__all__")
        typed = {(a.asname or a.name): (i.module, a.name) for n in tree.body if isinstance(n, ast.If)
                 and "TYPE_CHECKING" in ast.unparse(n.test) for i in n.body if isinstance(i, ast.ImportFrom)
                 for a in i.names}
        for name, (module, attribute) in table.items():
            assert name in exported, f"{face.relative_to(ROOT)}: {name} is loaded lazily but not in __all__"
            assert module.startswith(f"vpatch.{room}."), f"{face.relative_to(ROOT)}: {name} comes from {module}"
            assert typed.get(name) == (module, attribute), (
                f"{face.relative_to(ROOT)}: {name} needs `from {module} import {attribute}` under TYPE_CHECKING")
    for room, table in lazy.items():
        # a fresh interpreter per face: what the face alone loads
        script = ("import importlib, json, sys\n"
                  f"face, table = importlib.import_module('vpatch.{room}'), {table!r}\n"
                  "early = sorted({m for m, _ in table.values()} & set(sys.modules))\n"
                  "same = [n for n, (m, a) in table.items() if getattr(face, n) is getattr(importlib.import_module(m), a)]\n"
                  "print(json.dumps([early, sorted(same)]))\n")
        early, same = json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                                check=True).stdout)
        assert early == [], f"importing vpatch.{room} loads what it exports lazily: {early}"
        assert same == sorted(table), f"vpatch.{room}: lazy names that are not their module's: {sorted(set(table) - set(same))}"


@functools.cache
def all_imports(src: Path) -> tuple[Import, ...]:
    return tuple(imp for path in sorted((src / "vpatch").rglob("*.py")) for imp in imports(path, src))


def module_graph(src: Path, kinds: set[str]) -> dict[str, set[str]]:
    """Module -> the vpatch modules loading it loads, through imports of these kinds; importing `vpatch.a.b`
    runs `vpatch.a`'s face first, unless the importer is inside `vpatch.a`."""
    modules, graph = vpatch_modules(src), {}
    for imp in all_imports(src):
        if imp.where_in not in kinds:
            continue
        for dependency in resolve(imp.target, imp.names, modules):
            parts = dependency.split(".")
            for end in range(2, len(parts) + 1):
                step = ".".join(parts[:end])
                if step != imp.importer and not imp.importer.startswith(step + "."):
                    graph.setdefault(imp.importer, set()).add(step)
    return graph


def circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: set[frozenset[str]] = set()
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(frozenset(component))
    return found


def test_module_level_imports_form_no_circle() -> None:
    assert circles(module_graph(SRC, {"top"})) == set()
    for kinds, name in (({"top", "typing"}, "typing"), ({"top", "typing", "function"}, "function")):
        seen = circles(module_graph(SRC, kinds))
        assert seen == KNOWN_CIRCLES[name], f"circles through {name} imports: {sorted(map(sorted, seen))}"


def test_every_import_inside_a_function_says_why() -> None:
    counts: dict[str, int] = {}
    for imp in all_imports(SRC):
        if imp.where_in == "function" and not imp.reason:
            counts[imp.importer] = counts.get(imp.importer, 0) + 1
    more = {m: (n, KNOWN_UNEXPLAINED.get(m, 0)) for m, n in counts.items() if n > KNOWN_UNEXPLAINED.get(m, 0)}
    assert not more, ("imports inside functions with no `# lazy: <reason>` (move them to the top, or say why): "
                      f"module: (found, known) {more}")
    fewer = {m: (counts.get(m, 0), n) for m, n in KNOWN_UNEXPLAINED.items() if counts.get(m, 0) < n}
    assert not fewer, f"fewer unexplained imports than KNOWN_UNEXPLAINED says (lower it): {fewer}"


def test_the_checks_see_a_violation(tmp_path: Path) -> None:
    """The checks can fail: an upward import, another room's inner module, its own face, a private name and a
    circle, each in modules written here, are all found."""
    src = tmp_path / "src"
    for room in ("update", "git", "base"):
        (src / "vpatch" / room).mkdir(parents=True)
    (src / "vpatch" / "__init__.py").write_text("")
    (src / "vpatch" / "base" / "__init__.py").write_text("")
    (src / "vpatch" / "base" / "errors.py").write_text("class VpatchError(Exception): ...\n")
    (src / "vpatch" / "update" / "__init__.py").write_text("from vpatch.update.run import update\n__all__ = ['update']\n")
    (src / "vpatch" / "update" / "run.py").write_text("from vpatch.update import update\n\ndef update(): ...\n")
    (src / "vpatch" / "git" / "__init__.py").write_text("")
    (src / "vpatch" / "git" / "refs.py").write_text(
        "from vpatch import update\nfrom vpatch.update.run import _run\nfrom vpatch.base.errors import VpatchError\n"
        "from vpatch.git import core\n\ndef f():\n    from vpatch.base import errors\n")
    (src / "vpatch" / "git" / "core.py").write_text("from vpatch.git import refs\n")
    order = ["update", "git", "base"]
    found = sorted((f.kind, f.dependency) for f in findings(src, order))
    assert found == [("inner", "vpatch.base.errors"), ("inner", "vpatch.base.errors"), ("own face", "vpatch.update"),
                     ("upward", "vpatch.update"), ("upward", "vpatch.update.run")]
    refs = list(imports(src / "vpatch" / "git" / "refs.py", src))
    assert [i.where_in for i in refs] == ["top", "top", "top", "top", "function"]
    assert is_private(refs[1].names[0]) and not is_private("__future__")
    assert circles(module_graph(src, {"top"})) == {frozenset({"vpatch.git.refs", "vpatch.git.core"})}
    assert room_of("vpatch.__main__") == "commands" and room_of("vpatch") == "base"
    table = "# x\n\n## The rooms\n\n| Room | Why |\n|---|---|\n| `update` | a |\n| `git` | b |\n| `base` | c |\n\n## Next\n"
    assert room_order(table) == order


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
