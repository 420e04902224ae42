"""YAML as vpatch reads it: PyYAML's safe loader, except that a key given twice in one mapping is an error,
nesting too deep for Python's stack is a YAML error (not a RecursionError), and, on request, every plain
scalar keeps the text it was written as (so `0123`, `2.10`, `1:30`, `on` can be read back as those strings)."""

from __future__ import annotations

from typing import Any


class TextMap(dict[Any, Any]):
    """A mapping read with `keep_text`: `texts[key]` is the source text of a plain (unquoted) scalar value."""

    texts: dict[Any, str]


class TextList(list[Any]):
    """A sequence read with `keep_text`: `texts[i]` is the source text of item i when it is a plain scalar."""

    texts: list[str | None]


def load(text: str | bytes, *, keep_text: bool = False) -> Any:
    """Like `yaml.safe_load`; a duplicate key raises yaml.YAMLError (PyYAML would keep the last one silently).
    With `keep_text`, mappings and sequences come as TextMap / TextList (dict / list with `.texts`)."""
    import yaml  # lazy: PyYAML loads only when a file is read; --help reads none

    try:
        return yaml.load(text, Loader=_loader(keep_text))
    except RecursionError:
        raise yaml.YAMLError("it is nested more deeply than vpatch reads (Python's recursion limit); "
                             "no vpatch file needs more than a few levels") from None


def source_text(container: Any, key: Any) -> str | None:
    """The text `container[key]` was written as, when it is a plain scalar of a `keep_text` document."""
    texts = getattr(container, "texts", None)
    found = None
    if isinstance(texts, dict):
        found = texts.get(key)
    elif isinstance(texts, list) and isinstance(key, int) and 0 <= key < len(texts):
        found = texts[key]
    return found if isinstance(found, str) else None


_LOADERS: dict[bool, Any] = {}


def _loader(keep_text: bool) -> Any:
    if keep_text not in _LOADERS:
        _LOADERS[keep_text] = _make_loader(keep_text)
    return _LOADERS[keep_text]


def _plain(node: Any) -> str | None:
    import yaml  # lazy: PyYAML loads only when a file is read; --help reads none

    return node.value if isinstance(node, yaml.ScalarNode) and node.style is None else None


def _make_loader(keep_text: bool) -> Any:
    import yaml  # lazy: PyYAML loads only when a file is read; --help reads none

    class UniqueKeyLoader(yaml.SafeLoader):
        pass

    def mapping(loader: UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor`: merged keys may be overridden, which is no duplicate
            key = loader.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:
                continue  # an unhashable key: the safe loader's own check reports it
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark, f"the key {key!r} appears twice", key_node.start_mark)
        data = loader.construct_mapping(node, deep=deep)  # flattens `<<` merges into node.value first
        if not keep_text:
            return data
        out = TextMap(data)
        out.texts = {}
        for key_node, value_node in node.value:
            raw = _plain(value_node)
            if raw is not None:
                try:
                    out.texts[loader.construct_object(key_node, deep=deep)] = raw
                except TypeError:
                    continue
        return out

    def sequence(loader: UniqueKeyLoader, node: yaml.SequenceNode, deep: bool = False) -> Any:
        out = TextList(loader.construct_sequence(node, deep=deep))
        out.texts = [_plain(item) for item in node.value]
        return out

    UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    if keep_text:
        UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, sequence)
    return UniqueKeyLoader
