"""One rule for "which commit is the pin": `upstream.pin_commit` (checked against upstream). No other code in
src/ or scripts/ resolves `pin.ref` (or `pin.commit`) itself. Read from the source with `ast`."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / "src" / "vpatch" / "upstream" / "source.py"  # pin_commit and pin_moved live here


def is_pin_field(node: ast.AST) -> bool:
    """`<anything>.pin.ref` or `<anything>.pin.commit`."""
    return isinstance(node, ast.Attribute) and node.attr in ("ref", "commit") \
        and isinstance(node.value, ast.Attribute) and node.value.attr == "pin"


def resolves_the_pin(source: str, where: str) -> list[str]:
    """Calls of a resolver (`resolve`, `resolve_commit`, `resolve_commits`, `rev_parse`, ... by name or as an
    attribute) with the pin's ref or commit among their arguments, or a pin field used as a fallback for one
    (`config.pin.commit or resolve(...)`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if "resolve" in name or "rev_parse" in name:
                arguments = [*node.args, *(k.value for k in node.keywords)]
                if any(is_pin_field(n) for a in arguments for n in ast.walk(a)):
                    found.append(f"{where}:{node.lineno}: {name}() of the pin")
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and any(is_pin_field(v) for v in node.values) \
                and any(isinstance(n, ast.Call) for v in node.values for n in ast.walk(v)):
            found.append(f"{where}:{node.lineno}: the pin's commit with a fallback of its own")
    return found


def sources() -> list[Path]:
    scripts = [p for p in sorted((ROOT / "scripts").iterdir()) if p.is_file()
               and (p.suffix == ".py" or p.read_bytes().startswith(b"#!/usr/bin/env python"))]
    return [*sorted((ROOT / "src" / "vpatch").rglob("*.py")), *scripts]


def test_only_pin_commit_resolves_the_pin() -> None:
    found = [hit for path in sources() if path != HOME
             for hit in resolves_the_pin(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]
    assert not found, "the pin resolved outside upstream.pin_commit (call it instead):\n" + "\n".join(found)
    assert resolves_the_pin(HOME.read_text(encoding="utf-8"), "home"), "the check sees no resolution even at home"


def test_the_check_sees_each_way_of_resolving_the_pin() -> None:
    source = ("a = git.resolve_commit(repo, config.pin.ref)\n"
              "b = git.resolve_commits(repo, [config.pin.ref, *refs])\n"
              "c = config.pin.commit or upstream.resolve(repo, config.pin.ref, what='pin')\n"
              "d = resolve(repo, ref=self.config.pin.ref)\n"
              "e = config.pin.commit or git.head(repo)\n"
              "f = upstream.pin_commit(repo, config)\n"
              "g = f'{config.pin.ref} ({config.pin.commit})'\n")
    lines = sorted(hit.split(":")[1] for hit in resolves_the_pin(source, "x"))
    assert lines == ["1", "2", "3", "3", "4", "5"]
