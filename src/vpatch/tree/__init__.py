"""The series applied onto a ref as one commit per patch, exported back to the numbered files; a new patch.

Other rooms import these names from here; modules inside the room import each other directly."""

from vpatch.tree.export import ExportResult
from vpatch.tree.stack import Stack

__all__ = [
    "ExportResult",
    "Stack",
]
