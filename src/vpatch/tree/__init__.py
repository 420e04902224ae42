"""The series applied onto a ref as one commit per patch, exported back to the numbered files; a new patch.

Other rooms import these names from here; modules inside the room import each other directly."""

from vpatch.tree.export import ExportResult, export_series, tree_patch, tree_work
from vpatch.tree.newpatch import start_patch
from vpatch.tree.stack import AppliedPatch, Stack, apply_series, commit_patch, load_stack, save_stack

__all__ = [
    "AppliedPatch",
    "ExportResult",
    "Stack",
    "apply_series",
    "commit_patch",
    "export_series",
    "load_stack",
    "save_stack",
    "start_patch",
    "tree_patch",
    "tree_work",
]
