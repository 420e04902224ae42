"""YAML as vpatch reads it: PyYAML's safe loader, except that a key given twice in one mapping is an error."""

from __future__ import annotations

from typing import Any


def load(text: str | bytes) -> Any:
    """Like `yaml.safe_load`; a duplicate key raises yaml.YAMLError (PyYAML would keep the last one silently)."""
    import yaml

    return yaml.load(text, Loader=_loader())


_LOADER: Any = None


def _loader() -> Any:
    global _LOADER
    if _LOADER is None:
        import yaml

        class UniqueKeyLoader(yaml.SafeLoader):
            pass

        def mapping(loader: UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = loader.construct_object(key_node, deep=deep)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:
                    continue  # an unhashable key: the safe loader's own check reports it
                if duplicate:
                    raise yaml.constructor.ConstructorError(
                        "while reading a mapping", node.start_mark, f"the key {key!r} appears twice", key_node.start_mark)
            return loader.construct_mapping(node, deep=deep)

        UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
        _LOADER = UniqueKeyLoader
    return _LOADER
