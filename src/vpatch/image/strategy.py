"""How an image is produced from the pin and the series: its own module so the CLI can name the choices
(`vpatch build --strategy`) without loading image definitions, deploy suites and serve configs at start-up."""

from __future__ import annotations

from enum import Enum


class Strategy(str, Enum):
    AUTO = "auto"
    OVERLAY = "overlay"
    PRECOMPILED = "precompiled"
    SOURCE = "source"
