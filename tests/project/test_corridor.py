"""The drop decision's corridor, measured from the code: the call graph of the disposition (update/disposition.py),
built from the imports and the calls through the faces, reaches its own room and the evidence rooms only, and the
architecture doc lists the files it reaches; and one meaning per name: status runs no probe and update takes none
from status, no class name is defined twice in src/, no function is longer than a screenful or two. Read from the
source with `ast` and the text of the doc."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "vpatch"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

# Class names defined in more than one module that stay for now, each with its reason; the test also fails on an
# entry no longer defined twice, so the list only shrinks.
KNOWN_TWICE: dict[str, str] = {
    # serve/alive.py's source is the container's health check (serve/render.py embeds it in `docker run`): a rename
    # there changes every rendered command, and every running container would show drift (`serve --diff`)
    "Verdict": "serve/alive.py (is the server alive) beside verdict/judge.py: its source is the containers' health check",
}

# Functions longer than MAX_LINES that stay for now, with the reason; the list only shrinks.
MAX_LINES = 80
KNOWN_LONG: dict[str, str] = {
}


def test_the_architecture_doc_names_only_modules_that_exist() -> None:
    """Every module docs/architecture.md names exists: `room/module.py`, and a bare `module.py` in a room's
    paragraph (in that room, else anywhere in src/vpatch), and every room of its module map."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    missing = [f"{name} (in the paragraph of {room or 'no room'})" for room, name in named_modules(text)
               if not module_exists(room, name)]
    assert not missing, f"{ARCHITECTURE.relative_to(ROOT)} names modules that do not exist:\n" + "\n".join(missing)


def named_modules(text: str) -> Iterator[tuple[str | None, str]]:
    """(the room whose paragraph it is in, or None; the name) for each `x.py` or `room/x.py` in backticks."""
    rooms = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    for paragraph in re.split(r"\n\s*\n", text):
        start = re.match(r"\*\*([a-z_]+)/\*\*", paragraph)
        room = start.group(1) if start and start.group(1) in rooms else None
        for quoted in re.findall(r"`([^`\n]+)`", paragraph):
            yield from ((room, name) for name in re.findall(r"(?:[a-z_]+/)*[a-z_]+\.py\b", quoted))


def module_exists(room: str | None, name: str) -> bool:
    if "/" in name:
        return (PACKAGE / name).is_file() or (ROOT / name).is_file()
    if room is not None and (PACKAGE / room / name).is_file():
        return True
    return any(PACKAGE.rglob(name)) or any((ROOT / "tests").rglob(name)) or (ROOT / "scripts" / name).is_file()


def corridor(text: str | None = None) -> list[str]:
    """The files of the drop decision's walk: the numbered list under "Where is it decided that 0002 is dropped"."""
    text = ARCHITECTURE.read_text(encoding="utf-8") if text is None else text
    section = text.split("**Where is it decided that 0002 is dropped?**", 1)[1].split("\n\n**", 1)[0]
    steps = [line for line in section.splitlines() if re.match(r"\d+\. ", line)]
    return [re.findall(r"`([a-z_]+/[a-z_]+\.py)`", step)[0] for step in steps]


def test_the_walk_starts_at_a_command_and_ends_where_the_disposition_is_decided() -> None:
    files = corridor()
    assert all((PACKAGE / f).is_file() for f in files), files
    assert files[0].startswith("commands/") and files[-1] == DECIDES, files


# --- the decision's call graph, built from the code ------------------------------------------------------------

# the one module where what an update does with a patch is decided, and its entry points (status, the update)
DECIDES = "update/disposition.py"
ENTRIES = ("dispose_status", "first_rows", "dispose", "judge_with_status")
# the rooms the decision may read its evidence from (the doors and the base included); `update` is its own room
EVIDENCE_ROOMS = {"status", "verdict", "probes", "upstream", "series", "config", "git", "base"}


def modules(package: Path = PACKAGE) -> dict[str, ast.Module]:
    """Dotted module name -> its syntax tree (a package is its `__init__.py`)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = ast.parse(path.read_text(encoding="utf-8"))
    return out


class CallGraph:
    """Functions and classes as nodes; an edge for every name a body uses that resolves to another one, through
    the imports and the faces' re-exports (`from vpatch.verdict import classify` is verdict/case.py's `classify`;
    `narrow.narrow_series` with `narrow` a module is that module's function). A class stands for all its methods:
    a method called on an object whose type only the annotations say is reached through its class."""

    def __init__(self, package: Path = PACKAGE) -> None:
        self.trees = modules(package)
        self.defs = {m: {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
                     for m, tree in self.trees.items()}
        self.aliases = {m: self._aliases(m, tree) for m, tree in self.trees.items()}

    def _aliases(self, module: str, tree: ast.Module) -> dict[str, str | tuple[str, str]]:
        out: dict[str, str | tuple[str, str]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level and node.module.startswith("vpatch"):
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    out[a.asname or a.name] = full if full in self.trees else (node.module, a.name)
            elif isinstance(node, ast.Import):
                out.update({a.asname: a.name for a in node.names if a.asname and a.name.startswith("vpatch")})
        return out

    def resolve(self, module: str, name: str, depth: int = 0) -> str | tuple[str, str] | None:
        """A module's name, or (module, name) where the name is defined; None when it is not vpatch's."""
        if module not in self.trees or depth > 10:
            return None
        if name in self.defs[module]:
            return module, name
        target = self.aliases[module].get(name)
        if target is None or isinstance(target, str):
            return target
        return self.resolve(*target, depth=depth + 1)

    def uses(self, module: str, name: str) -> set[tuple[str, str]]:
        out = set()
        for node in ast.walk(self.defs[module][name]):
            found: str | tuple[str, str] | None = None
            if isinstance(node, ast.Name):
                found = self.resolve(module, node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                owner = self.resolve(module, node.value.id)
                found = self.resolve(owner, node.attr) if isinstance(owner, str) else None
            if isinstance(found, tuple):
                out.add(found)
        return out

    def reached(self, entries: list[tuple[str, str]]) -> set[tuple[str, str]]:
        seen: set[tuple[str, str]] = set()
        todo = list(entries)
        while todo:
            key = todo.pop()
            if key not in seen:
                seen.add(key)
                todo += self.uses(*key) - seen
        return seen


def as_file(module: str) -> str:
    """"vpatch.update.plan" -> "update/plan.py"."""
    return "/".join(module.split(".")[1:]) + ".py"


def decision_files() -> set[str]:
    graph = CallGraph()
    decides = "vpatch." + DECIDES.removesuffix(".py").replace("/", ".")
    return {as_file(m) for m, _ in graph.reached([(decides, e) for e in ENTRIES])}


def documented_files(text: str | None = None) -> set[str]:
    """The files the architecture doc lists as the decision's (the paragraph "The decision's files")."""
    text = ARCHITECTURE.read_text(encoding="utf-8") if text is None else text
    paragraph = text.split("**The decision's files**", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r"`([a-z_]+/[a-z_]+\.py)`", paragraph))


def test_the_decision_is_one_room_plus_the_evidence_rooms_it_reads() -> None:
    """From the calls: the disposition reaches its own room (update) and the evidence rooms only: no command, no
    report, nothing that carries an update out (run, commit, journal, a person's work at a stop), no image."""
    files = decision_files()
    rooms = {f.split("/")[0] for f in files}
    assert rooms <= EVIDENCE_ROOMS | {"update"}, sorted(rooms - EVIDENCE_ROOMS - {"update"})
    carrying_out = {f"update/{m}.py" for m in ("run", "commit", "journal", "handwork", "resolution", "furthest")}
    assert not files & carrying_out, sorted(files & carrying_out)


def test_the_doc_lists_the_decision_s_files_as_the_code_has_them() -> None:
    """docs/architecture.md names the decision's own files (update/, status/, verdict/) that the call graph reaches;
    the rooms below them it names as rooms."""
    files = {f for f in decision_files() if f.split("/")[0] in ("update", "status", "verdict")}
    listed = documented_files()
    assert listed == files, (f"docs/architecture.md's decision's files differ from the call graph: missing "
                             f"{sorted(files - listed)}, not reached {sorted(listed - files)}")


def test_status_and_update_reach_the_one_disposition() -> None:
    """`vpatch status` shows the dispositions (dispose_status, every target), `vpatch update` carries one target's
    out (dispose), both in the one module."""
    graph = CallGraph()
    assert ("vpatch.update.disposition", "dispose_status") in graph.reached([("vpatch.commands.status", "run")])
    assert ("vpatch.update.disposition", "dispose") in graph.reached([("vpatch.commands.update", "run")])


def test_the_call_graph_follows_faces_and_module_attributes(tmp_path: Path) -> None:
    pkg = tmp_path / "vpatch"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("from vpatch.low.inner import helper\n")
    (pkg / "low" / "inner.py").write_text("def helper():\n    return deep()\n\ndef deep():\n    return 1\n\n"
                                          "def unused():\n    return 2\n")
    (pkg / "low" / "other.py").write_text("def far():\n    return 3\n")
    (pkg / "top.py").write_text("from vpatch.low import helper\nfrom vpatch.low import other\n\n"
                                "def entry():\n    return helper() + other.far()\n")
    graph = CallGraph(pkg)
    assert {m for m, _ in graph.reached([("vpatch.top", "entry")])} == {"vpatch.top", "vpatch.low.inner",
                                                                       "vpatch.low.other"}
    assert ("vpatch.low.inner", "unused") not in graph.reached([("vpatch.top", "entry")])


def test_the_doc_checks_see_a_missing_module() -> None:
    doc = ("**Where is it decided that 0002 is dropped?** Walk:\n\n1. `commands/status.py` in\n2. `status/gone.py`\n\n"
           "**verdict/**. `judge.py` and `nosuch.py`.\n")
    assert corridor(doc) == ["commands/status.py", "status/gone.py"]
    found = [(room, name) for room, name in named_modules(doc) if not module_exists(room, name)]
    assert found == [(None, "status/gone.py"), ("verdict", "nosuch.py")]


def room_imports(room: str) -> Iterator[tuple[str, tuple[str, ...]]]:
    """(module imported from, names) for every import in the room, top level, typing-only and lazy alike."""
    for path in sorted((PACKAGE / room).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                yield node.module, tuple(a.name for a in node.names)
            elif isinstance(node, ast.Import):
                yield from ((a.name, ()) for a in node.names)


def test_status_holds_no_probe_plumbing() -> None:
    """status asks the probes room's door (probes.Witness) and nothing behind it: no runner, workspace, probe file
    or probe check module, and no class of its own that runs or wraps probes (reading what the verdicts say of
    them, as Status.probe_problems does, is status's own)."""
    inner = [f"{target} {names}" for target, names in room_imports("status")
             if target.startswith("vpatch.probes.") or (target == "vpatch.probes" and set(names) & {
                 "runner", "workspace", "check", "file", "env", "zygote", "witness"})]
    assert not inner, f"status reaches behind the probes room's door: {inner}"
    defined = [node.name for path in (PACKAGE / "status").rglob("*.py")
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
               if (isinstance(node, ast.ClassDef) and "probe" in node.name.lower())
               or (isinstance(node, ast.FunctionDef) and node.name in ("probe_fn", "run_probe", "validate_probe"))]
    assert not defined, f"probe plumbing defined in status/: {defined}"


def test_update_takes_nothing_for_probes_from_status() -> None:
    taken = [f"{target}: {names}" for target, names in room_imports("update")
             if target.startswith("vpatch.status") and any("probe" in n.lower() for n in names)]
    inner = [target for target, _ in room_imports("update") if target.startswith("vpatch.status.")]
    assert not taken and not inner, f"update reaches into status for probes: {taken + inner}"


def class_names(package: Path = PACKAGE) -> dict[str, list[str]]:
    """Class name -> the modules (relative to `package`) that define a class of that name, at any depth."""
    found: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(str(path.relative_to(package)))
    return found


def test_no_class_name_is_defined_twice_in_src() -> None:
    twice = {name: where for name, where in class_names().items() if len(where) > 1}
    unknown = {name: where for name, where in twice.items() if name not in KNOWN_TWICE}
    assert not unknown, f"class names defined in more than one module (name each for what it is): {unknown}"
    stale = sorted(set(KNOWN_TWICE) - set(twice))
    assert not stale, f"names in KNOWN_TWICE that are defined once now (delete them from the list): {stale}"


def test_the_name_check_sees_a_twin(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.py").write_text("class Plan: ...\nclass Only: ...\n")
    (tmp_path / "y.py").write_text("def f():\n    class Plan: ...\n")
    assert class_names(tmp_path) == {"Plan": ["a/x.py", "y.py"], "Only": ["a/x.py"]}


def long_functions(package: Path = PACKAGE, limit: int = MAX_LINES) -> dict[str, int]:
    """`module.function` (methods as `module.Class.method`) -> its lines, for each longer than `limit`."""
    found: dict[str, int] = {}
    for path in sorted(package.rglob("*.py")):
        module = ".".join(path.relative_to(package.parent).with_suffix("").parts)

        def visit(node: ast.AST, prefix: str) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = (child.end_lineno or child.lineno) - child.lineno + 1
                    if lines > limit:
                        found[f"{prefix}.{child.name}"] = lines
                    visit(child, f"{prefix}.{child.name}")
                elif isinstance(child, ast.ClassDef):
                    visit(child, f"{prefix}.{child.name}")

        visit(ast.parse(path.read_text(encoding="utf-8")), module)
    return found


def test_no_function_is_longer_than_eighty_lines() -> None:
    long = long_functions()
    unknown = {name: lines for name, lines in long.items() if name not in KNOWN_LONG}
    assert not unknown, f"functions over {MAX_LINES} lines (split them into named steps): {unknown}"
    stale = sorted(set(KNOWN_LONG) - set(long))
    assert not stale, f"functions in KNOWN_LONG that are short now (delete them from the list): {stale}"


def test_the_deploy_runbook_is_steps_of_at_most_sixty_lines() -> None:
    """`vpatch deploy` reads as its runbook (issue 45): `_deploy` and each step it calls fit on a screen."""
    long = {name: lines for name, lines in long_functions(limit=60).items() if name.startswith("vpatch.deploy.switch.")}
    assert not long, f"deploy/switch.py: functions over 60 lines (split them into the runbook's steps): {long}"


def test_the_length_check_sees_a_long_function(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("class C:\n    def long(self):\n" + "        x = 1\n" * 5 + "\ndef short():\n    pass\n")
    assert long_functions(tmp_path / "pkg", limit=5) == {"pkg.m.C.long": 6}
