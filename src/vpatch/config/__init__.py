"""vpatch.yaml and images/<name>.yaml as typed models (with their serve: and deploy: sections), read through
one document reader and one YAML loader, and the rules between their sections.

Other rooms import these names from here; modules inside the room import each other directly."""

from vpatch.config.definition import Base, ImageDefinition, Strategy, definition_name_ok, image_reference_ok
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
from vpatch.config.hosts import Endpoint, EndpointKind, Host, HostRole
from vpatch.config.project import CONFIG_NAME, Config, Pin, find_root, repin_text
from vpatch.config.serve import ServeConfig
from vpatch.config.yamlload import load as load_yaml

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
