"""How results are shown: tables, lines and JSON for the CLI to print. Nothing here prints.

Other rooms import these names from here; modules inside the room import each other directly."""

from vpatch.report.console import ProgressView

__all__ = [
    "ProgressView",
]
