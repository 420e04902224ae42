"""vpatch.yaml and images/<name>.yaml as typed models (with their serve: and deploy: sections), read through
one document reader and one YAML loader, and the rules between their sections.

Other rooms import these names from here; modules inside the room import each other directly."""

from typing import TYPE_CHECKING

from vpatch.base import lazy_exports
from vpatch.config.definition import Base, ImageDefinition, Strategy, definition_name_ok, image_reference_ok
from vpatch.config.hosts import Endpoint, EndpointKind, Host, HostRole
from vpatch.config.project import CONFIG_NAME, Config, Pin, find_root, repin_text
from vpatch.config.yamlload import load as load_yaml

if TYPE_CHECKING:
    from vpatch.config.deploy import (
        BlockCostCheck,
        Hooks,
        KvPoolCheck,
        MemoryCheck,
        NeedleCheck,
        ParallelCheck,
        QuestionCheck,
        Suite,
        TimingCheck,
    )
    from vpatch.config.serve import ServeConfig

# name -> (module, name there): loaded on first use (PEP 562), because the serve: and deploy: models (two dozen
# dataclasses) are what only serve, deploy and an image's validate() read: status and build never load them.
# tests/project/test_architecture.py checks each entry.
_LAZY: dict[str, tuple[str, str]] = {
    "BlockCostCheck": ("vpatch.config.deploy", "BlockCostCheck"),
    "Hooks": ("vpatch.config.deploy", "Hooks"),
    "KvPoolCheck": ("vpatch.config.deploy", "KvPoolCheck"),
    "MemoryCheck": ("vpatch.config.deploy", "MemoryCheck"),
    "NeedleCheck": ("vpatch.config.deploy", "NeedleCheck"),
    "ParallelCheck": ("vpatch.config.deploy", "ParallelCheck"),
    "QuestionCheck": ("vpatch.config.deploy", "QuestionCheck"),
    "Suite": ("vpatch.config.deploy", "Suite"),
    "TimingCheck": ("vpatch.config.deploy", "TimingCheck"),
    "ServeConfig": ("vpatch.config.serve", "ServeConfig"),
}

if not TYPE_CHECKING:  # mypy reads the names from the imports above, not from a catch-all
    __getattr__ = lazy_exports(globals(), _LAZY)

__all__ = [
    "CONFIG_NAME",
    "Base",
    "BlockCostCheck",
    "Config",
    "Endpoint",
    "EndpointKind",
    "Hooks",
    "Host",
    "HostRole",
    "ImageDefinition",
    "KvPoolCheck",
    "MemoryCheck",
    "NeedleCheck",
    "ParallelCheck",
    "Pin",
    "QuestionCheck",
    "ServeConfig",
    "Strategy",
    "Suite",
    "TimingCheck",
    "definition_name_ok",
    "find_root",
    "image_reference_ok",
    "load_yaml",
    "repin_text",
]
