"""A lock that cannot be made says why in words a person can act on (base/lock.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vpatch.base.lock import LockFolderError, exclusive


def test_a_cache_linked_to_a_removed_folder_is_named_as_a_link_to_nowhere(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen here: ~/.cache/vpatch a link to a folder since removed; mkdir said only "File exists"."""
    gone = tmp_path / "gone" / "vpatch"
    link = tmp_path / "cache"
    link.symlink_to(gone)
    monkeypatch.setenv("VPATCH_CACHE", str(link))
    with pytest.raises(LockFolderError) as info:
        with exclusive(link / "releases.lock", what="vpatch releases"):
            pass
    assert info.value.message == (f"cannot take the lock {link / 'releases.lock'}: {link} is a link to {gone}, "
                                  "which does not exist")
    assert info.value.hint == f"create {gone}, or remove the link {link} (vpatch then makes a folder there)"
    assert link.is_symlink() and not gone.exists()  # nothing made, nothing removed


def test_a_cache_path_that_is_a_file_names_the_variable_that_moves_the_cache(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    cache.write_text("not a folder")
    monkeypatch.setenv("VPATCH_CACHE", str(cache))
    with pytest.raises(LockFolderError, match=r"cannot take the lock .*: .*/cache is a file, not a folder$") as info:
        with exclusive(cache / "releases.lock", what="vpatch releases"):
            pass
    assert info.value.hint == f"{cache} must be a writable folder; $VPATCH_CACHE moves that folder elsewhere"
    assert cache.read_text() == "not a folder"
