"""vpatch.yaml: the upstream, the pin and the patches folder, validated with errors that name the key."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from vpatch.base import ConfigError, atomic_write
from vpatch.config.document import Document

CONFIG_NAME = "vpatch.yaml"
DEFAULT_GIT_URL = "https://github.com/vllm-project/vllm.git"
SOURCES = ("git", "releases")
_PROJECT_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")


@dataclass(frozen=True)
class Upstream:
    git: str = DEFAULT_GIT_URL
    releases: str | None = None  # PyPI project whose sdists form the release history, e.g. "vllm"
    source: str = "git"  # which of the two answers refs: "git" or "releases"
    branch: str = "main"  # upstream default branch, a status target when source is git


@dataclass(frozen=True)
class Pin:
    ref: str
    commit: str | None = None  # resolved SHA, written by vpatch


@dataclass(frozen=True)
class Config:
    root: Path
    upstream: Upstream
    pin: Pin
    patches: str = "patches"

    @property
    def path(self) -> Path:
        return self.root / CONFIG_NAME

    @property
    def patches_dir(self) -> Path:
        return self.root / self.patches

    @property
    def state_dir(self) -> Path:
        """Per-checkout working state (worktree records, update state); never committed."""
        return self.root / ".vpatch"

    @classmethod
    def load(cls, root: Path) -> Config:
        path = root / CONFIG_NAME
        if not path.is_file():
            raise ConfigError(
                f"no {CONFIG_NAME} in {root}",
                hint="run vpatch in the project folder (the one holding vpatch.yaml), or pass --project",
            )
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read: {exc}", hint="vpatch.yaml must be a readable UTF-8 YAML file") from exc
        return cls.parse(text, root=root, source=str(path))

    @classmethod
    def parse(cls, text: str, *, root: Path, source: str) -> Config:
        doc, data = Document.parse(text, source=source)
        top = doc.mapping(data, "", required={"pin"}, optional={"upstream", "patches"})
        up = doc.mapping(top.get("upstream", {}), "upstream", optional={"git", "releases", "source", "branch"})
        upstream = Upstream(
            git=doc.string(up, "upstream.git", DEFAULT_GIT_URL),
            releases=doc.optional_string(up, "upstream.releases"),
            source=doc.string(up, "upstream.source", "releases" if up.get("releases") and "git" not in up else "git"),
            branch=doc.string(up, "upstream.branch", "main"),
        )
        if upstream.source not in SOURCES:
            doc.fail("upstream.source", f"must be one of {', '.join(SOURCES)}, not {upstream.source!r}")
        if upstream.source == "releases" and not upstream.releases:
            doc.fail("upstream.releases", "is required when upstream.source is 'releases' (e.g. releases: vllm)")
        if upstream.releases is not None and not _PROJECT_NAME.match(upstream.releases):
            # the name becomes a folder in the cache: no path may escape it
            doc.fail("upstream.releases", f"must be a PyPI project name (letters, digits, '.', '_', '-'), "
                     f"not {upstream.releases!r}")
        pin_data = doc.mapping(top["pin"], "pin", required={"ref"}, optional={"commit"})
        commit = doc.optional_string(pin_data, "pin.commit")
        if commit is not None and (len(commit) != 40 or any(c not in "0123456789abcdef" for c in commit)):
            doc.fail("pin.commit", f"must be a full 40-hex commit SHA, not {commit!r}")
        pin = Pin(ref=doc.string(pin_data, "pin.ref"), commit=commit)
        patches = doc.string(top, "patches", "patches")
        if Path(patches).is_absolute() or ".." in Path(patches).parts:
            doc.fail("patches", f"must be a folder inside the project, not {patches!r}")
        return cls(root=root, upstream=upstream, pin=pin, patches=patches)

    def with_pin(self, ref: str, commit: str) -> Config:
        return replace(self, pin=Pin(ref=ref, commit=commit))

    def dump(self) -> str:
        import yaml  # lazy: PyYAML loads only when a file is read; --help reads none

        up: dict[str, Any] = {"source": self.upstream.source, "git": self.upstream.git}
        if self.upstream.releases:
            up["releases"] = self.upstream.releases
        if self.upstream.branch != "main":
            up["branch"] = self.upstream.branch
        pin: dict[str, Any] = {"ref": self.pin.ref}
        if self.pin.commit:
            pin["commit"] = self.pin.commit
        data = {"upstream": up, "pin": pin, "patches": self.patches}
        header = "# vpatch project: upstream vLLM, the pin, and the numbered patch series.\n"
        return header + yaml.safe_dump(data, sort_keys=False)

    def save(self) -> None:
        atomic_write(self.path, self.dump().encode())


def find_root(start: Path) -> Path:
    """The nearest folder at or above `start` holding vpatch.yaml (or `start` when there is none)."""
    for folder in (start, *start.parents):
        if (folder / CONFIG_NAME).is_file():
            return folder
    return start


def repin_text(text: str, ref: str, commit: str) -> str:
    """vpatch.yaml's text with the pin moved, comments and layout kept; a fresh dump when the pin block is unusual."""

    block = re.search(r"^pin:[ \t]*\n((?:[ \t]+.*\n|[ \t]*\n)*)", text if text.endswith("\n") else text + "\n", re.M)
    if block is not None:
        body = block[1]
        indent = re.match(r"[ \t]+", body)
        pad = indent[0] if indent else "  "
        new, refs = re.subn(r"^([ \t]+)ref:[^\n]*$", lambda m: f"{m[1]}ref: {ref}", body, count=1, flags=re.M)
        if re.search(r"^[ \t]+commit:", new, re.M):
            new = re.sub(r"^([ \t]+)commit:[^\n]*$", lambda m: f"{m[1]}commit: {commit}", new, count=1, flags=re.M)
        else:
            new = re.sub(r"^([ \t]+ref:[^\n]*\n)", lambda m: f"{m[1]}{pad}commit: {commit}\n", new, count=1, flags=re.M)
        out = text[: block.start(1)] + new + text[block.end(1):]
        try:
            parsed = Config.parse(out, root=Path("."), source=CONFIG_NAME)
        except ConfigError:
            parsed = None
        if refs == 1 and parsed is not None and (parsed.pin.ref, parsed.pin.commit) == (ref, commit):
            return out
    return Config.parse(text, root=Path("."), source=CONFIG_NAME).with_pin(ref, commit).dump()
