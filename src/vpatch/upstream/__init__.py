"""Where upstream vLLM is read from: a bare git mirror or the release history built from PyPI; and how its commits
relate (the history part: lineage, moves, hunkmoves, over the commit cache).

Other rooms import these names from here; modules inside the room import each other directly. The history
modules' functions carry room-local names (`follow`, `plan`, `identity`, `save`): the face exports them under
names that say what they are. The release history's builder (releases.py) loads the PyPI client, so its names
load when first used (`_LAZY`), not with the face."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vpatch.base import lazy_exports
from vpatch.upstream.commitcache import declare as declare_commit_range
from vpatch.upstream.commitcache import diff_patch_id, diff_patch_ids
from vpatch.upstream.commitcache import first_parent_commits as cached_first_parent_commits
from vpatch.upstream.commitcache import is_ancestor as cached_is_ancestor
from vpatch.upstream.commitcache import merge_base as cached_merge_base
from vpatch.upstream.commitcache import save as save_commit_facts
from vpatch.upstream.hunkmoves import HunkMove
from vpatch.upstream.hunkmoves import asks as hunks_to_find
from vpatch.upstream.hunkmoves import lost as hunk_lost
from vpatch.upstream.hunkmoves import plan as hunk_placements
from vpatch.upstream.hunkmoves import relocate as relocate_hunks
from vpatch.upstream.hunkmoves import relocated as relocated_patch
from vpatch.upstream.lineage import (
    ChangeHistory,
    HistoryEvent,
    ReleaseProof,
    ancestry_order,
    first_release,
    nearest_ancestor,
    release_tags,
    release_version,
    revert_commits,
)
from vpatch.upstream.lineage import direction as direction_between
from vpatch.upstream.lineage import identity as change_history
from vpatch.upstream.lineage import identity_grep as change_history_grep
from vpatch.upstream.lineage import refs_state as refs_digest
from vpatch.upstream.mirror import fetch as fetch_mirror
from vpatch.upstream.mirror import prefetch_tree
from vpatch.upstream.moves import Fate, Move, missing_paths
from vpatch.upstream.moves import follow as follow_file_moves
from vpatch.upstream.moves import retarget as retarget_paths
from vpatch.upstream.moves import touched as moves_read_by
from vpatch.upstream.prefetch import prefetch_for_status
from vpatch.upstream.source import history_path, open_upstream, pin_commit, pin_moved, resolve

if TYPE_CHECKING:
    from vpatch.upstream.index import IndexSettings
    from vpatch.upstream.releases import Release, list_releases
    from vpatch.upstream.releases import update as update_releases

# name -> (module, name there): loaded on first use (PEP 562), because releases.py loads the PyPI client (http,
# ssl) that no other command needs; tests/project/test_architecture.py checks each entry. The probe venv's
# installer reads pip's sources from the same place (IndexSettings).
_LAZY: dict[str, tuple[str, str]] = {
    "IndexSettings": ("vpatch.upstream.index", "IndexSettings"),
    "Release": ("vpatch.upstream.releases", "Release"),
    "list_releases": ("vpatch.upstream.releases", "list_releases"),
    "update_releases": ("vpatch.upstream.releases", "update"),
}

if not TYPE_CHECKING:  # mypy reads the names from the imports above, not from a catch-all
    __getattr__ = lazy_exports(globals(), _LAZY)

__all__ = [
    "ChangeHistory",
    "Fate",
    "HistoryEvent",
    "HunkMove",
    "IndexSettings",
    "Move",
    "Release",
    "ReleaseProof",
    "ancestry_order",
    "cached_first_parent_commits",
    "cached_is_ancestor",
    "cached_merge_base",
    "change_history",
    "change_history_grep",
    "declare_commit_range",
    "diff_patch_id",
    "diff_patch_ids",
    "direction_between",
    "fetch_mirror",
    "first_release",
    "follow_file_moves",
    "history_path",
    "hunk_lost",
    "hunk_placements",
    "hunks_to_find",
    "list_releases",
    "missing_paths",
    "moves_read_by",
    "nearest_ancestor",
    "open_upstream",
    "pin_commit",
    "pin_moved",
    "prefetch_for_status",
    "prefetch_tree",
    "refs_digest",
    "release_tags",
    "release_version",
    "relocate_hunks",
    "relocated_patch",
    "resolve",
    "retarget_paths",
    "revert_commits",
    "save_commit_facts",
    "update_releases",
]
