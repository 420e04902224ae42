"""`vpatch forward NNNN --record URL`: where the patch was sent, written into its header (Forwarded:, and
Upstream-PR: for a GitHub pull request, which status's landing search then finds as "(#N)"), every other byte
of the file as it was."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vpatch.base import VpatchError, atomic_write
from vpatch.series import Series, pull_number, with_forwarded

if TYPE_CHECKING:
    from vpatch.config import Config


@dataclass(frozen=True)
class Recorded:
    file: Path
    url: str
    pr: int | None
    changed: bool  # False: the header said so already

    def to_json(self) -> dict[str, object]:
        return {"file": str(self.file), "url": self.url, "pr": self.pr, "changed": self.changed}


def record_forwarded(config: Config, key: str, url: str) -> Recorded:
    """Write `Forwarded: url` (and `Upstream-PR: N` for https://github.com/OWNER/REPO/pull/N) into the patch."""
    if "://" not in url or any(c.isspace() for c in url):
        raise VpatchError(f"--record {url!r} is not a URL",
                          hint="give the pull request's address, e.g. https://github.com/vllm-project/vllm/pull/12345")
    patch = Series.load(config.patches_dir).get(key)
    pr = pull_number(url)
    raw = with_forwarded(patch.raw, url, pr, where=patch.filename)
    if raw != patch.raw:
        atomic_write(patch.path, raw)
    return Recorded(patch.path, url, pr, raw != patch.raw)
