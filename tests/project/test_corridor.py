"""The drop decision's corridor as docs/architecture.md walks it, and one meaning per name: the files the walk
names exist and are few, status runs no probe and update takes none from status, no class name is defined twice
in src/, no function is longer than a screenful or two. Read from the source with `ast` and the text of the doc."""

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


def test_the_drop_decision_crosses_at_most_eight_files_and_they_exist() -> None:
    files = corridor()
    assert 3 <= len(files) <= 9, f"the walk of the drop decision names {len(files)} files: {files}"
    assert all((PACKAGE / f).is_file() for f in files), files
    assert files[0].startswith("commands/") and files[-1] == "update/disposition.py", files


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
