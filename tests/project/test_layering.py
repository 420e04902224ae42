"""What the rooms test (test_architecture.py) cannot see: the top package imports nothing (importing any module
of vpatch runs vpatch/__init__.py), the config layer's modules, and the definition's old homes are gone."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

# The config layer, bottom of the project: errors and atomic writes, the YAML loader and the one document
# reader, vpatch.yaml, and the image definition with its serve: and deploy: sections and the rules between them.
CONFIG_LAYER = {
    "vpatch.base.errors", "vpatch.base.fs", "vpatch.config.yamlload", "vpatch.config.document", "vpatch.config.project",
    "vpatch.config.definition", "vpatch.config.consistency", "vpatch.config.serve", "vpatch.config.deploy",
}
# Importing any vpatch module runs vpatch/__init__.py: it stays empty of imports. (The config models used to
# live in serve/ and deploy/, whose packages had to stay empty too; config/ holds them now, with a face.)
PACKAGES = {"vpatch"}


def imports_of(module: str) -> set[str]:
    parts = module.split(".")
    path = SRC.joinpath(*parts[:-1], parts[-1] + ".py")
    if not path.is_file():
        path = SRC.joinpath(*parts, "__init__.py")
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in CONFIG_LAYER)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m == "vpatch" or m.startswith("vpatch.")}


def test_the_packages_the_config_layer_lives_in_import_nothing() -> None:
    assert {p: sorted(imports_of(p)) for p in PACKAGES if imports_of(p)} == {}


def test_nothing_imports_the_old_homes_of_the_definition() -> None:
    """image/definition.py and image/strategy.py are gone; everything reads the one model in vpatch.config.definition."""
    users = [p for p in SRC.rglob("*.py")
             if {"vpatch.image.definition", "vpatch.image.strategy"} & imports_of_file(p)]
    assert users == []


def imports_of_file(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out
