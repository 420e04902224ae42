"""Which build strategy (overlay / precompiled / source) the series needs, why, and the exact build it means."""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import PurePosixPath

from vpatch.base import VpatchError
from vpatch.config import ImageDefinition, Strategy
from vpatch.series import Patch

# Bumped when the overlay recipe's meaning changes, so old content tags are not reused for it.
RECIPE_VERSION = "vpatch-image/1"
PACKAGE = "vllm"
LABEL_PREFIX = "io.vpatch"

_NATIVE_DIRS = ("csrc/", "cmake/", "rust/")
_NATIVE_FILES = {"CMakeLists.txt", "setup.py", "build_rust.sh", "Cargo.toml", "Cargo.lock"}
_NATIVE_SUFFIXES = {".c", ".cc", ".cpp", ".cxx", ".cu", ".cuh", ".h", ".hh", ".hpp", ".rs", ".cmake", ".so", ".pyx"}
# Never in the image: changing them changes no build output.
_UNSHIPPED_DIRS = ("tests/", "docs/", "examples/", "benchmarks/", ".github/", ".buildkite/")
_UNSHIPPED_SUFFIXES = {".md", ".rst"}

# vLLM's docker/Dockerfile build args, by role; the first one the pin's Dockerfile declares is used.
PRECOMPILED_ARGS = ("VLLM_USE_PRECOMPILED",)
WHEEL_COMMIT_ARGS = ("VLLM_MERGE_BASE_COMMIT", "VLLM_PRECOMPILED_WHEEL_COMMIT")
_ARG = re.compile(r"^\s*ARG\s+(.+)$", re.M)


class ChangeKind(str, Enum):
    """What changing a path means for the image."""

    PACKAGE = "package"  # a non-native file of the installed vllm/ package: copy it
    NATIVE = "native"  # compiled code or its build: only a source build ships it
    BUILD = "build"  # packaging/dependencies/Dockerfile: needs vLLM's own image build
    UNSHIPPED = "unshipped"  # tests, docs: not in the image


def classify(path: str) -> ChangeKind:
    suffix = PurePosixPath(path).suffix
    if path.startswith(_NATIVE_DIRS) or path in _NATIVE_FILES or suffix in _NATIVE_SUFFIXES:
        return ChangeKind.NATIVE
    if path.startswith(f"{PACKAGE}/"):
        return ChangeKind.PACKAGE
    if path.startswith(_UNSHIPPED_DIRS) or suffix in _UNSHIPPED_SUFFIXES:
        return ChangeKind.UNSHIPPED
    return ChangeKind.BUILD


@dataclass(frozen=True)
class Changes:
    """The series' net effect on files, as paths relative to the upstream tree."""

    written: tuple[str, ...]  # added or modified: present after the series
    deleted: tuple[str, ...]  # present at the pin, absent after the series
    added: tuple[str, ...] = ()  # the subset of `written` absent at the pin

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(sorted({*self.written, *self.deleted}))

    def within(self, folder: str) -> Changes:
        """Only the changes under `folder/` (what an overlay ships)."""
        def inside(paths: tuple[str, ...]) -> tuple[str, ...]:
            return tuple(p for p in paths if p.startswith(f"{folder}/"))

        return Changes(written=inside(self.written), deleted=inside(self.deleted), added=inside(self.added))

    @classmethod
    def of(cls, patches: Sequence[Patch]) -> Changes:
        """Follow creations, deletions and renames through the series in order."""
        exists: dict[str, bool] = {}  # path -> exists after the patches so far
        created_first: set[str] = set()  # paths whose first event is a creation: absent at the pin
        for patch in patches:
            for f in patch.files:
                if f.old_path is None and f.new_path is not None:
                    if f.new_path not in exists:
                        created_first.add(f.new_path)
                    exists[f.new_path] = True
                elif f.new_path is None and f.old_path is not None:
                    exists[f.old_path] = False
                else:
                    assert f.old_path is not None and f.new_path is not None
                    if f.old_path != f.new_path:
                        exists[f.old_path] = False
                        if f.new_path not in exists:
                            created_first.add(f.new_path)
                    exists[f.new_path] = True
        written = tuple(sorted(p for p, e in exists.items() if e))
        deleted = tuple(sorted(p for p, e in exists.items() if not e and p not in created_first))
        added = tuple(sorted(p for p in written if p in created_first))
        return cls(written=written, deleted=deleted, added=added)


@dataclass(frozen=True)
class BaseFacts:
    """What vpatch found out about the base image on the daemon (overlay only)."""

    reference: str  # what the build goes FROM
    image_id: str
    digest: str | None  # registry digest, when the daemon knows one
    package_dir: str  # the installed vllm/ folder inside it


@dataclass(frozen=True)
class BuildPlan:
    image: ImageDefinition
    strategy: Strategy
    reason: str
    version: str
    pin_ref: str
    pin_commit: str
    patches: tuple[Patch, ...]
    changes: Changes
    content_hash: str
    tags: tuple[str, ...]  # content tag first, then the moving tag
    labels: Mapping[str, str]  # all but org.opencontainers.image.created (set at build time)
    buildargs: Mapping[str, str]
    dockerfile: str
    context: str
    target: str | None
    base: str | None
    base_facts: BaseFacts | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def content_tag(self) -> str:
        return self.tags[0]

    def command(self, cli: Sequence[str] = ("docker", "build"), env: Mapping[str, str] | None = None) -> str:
        """The build as one docker command line (overlay runs the same build through the SDK)."""
        argv = [*cli, "--network", "none" if self.strategy is Strategy.OVERLAY else "host", "-f", self.dockerfile]
        if self.target:
            argv += ["--target", self.target]
        for key, value in self.buildargs.items():
            argv += ["--build-arg", f"{key}={value}"]
        for key, value in self.labels.items():
            argv += ["--label", f"{key}={value}"]
        for tag in self.tags:
            argv += ["-t", tag]
        argv.append(self.context)
        prefix = " ".join(f"{k}={v}" for k, v in (env or {}).items())
        return (prefix + " " if prefix else "") + shlex.join(argv)


def wrap_command(line: str) -> list[str]:
    """A long command line as shell continuation lines: the program, then one option (with its value) a line."""
    lines: list[list[str]] = [[]]
    for word in shlex.split(line):
        current = lines[-1]
        opens_option = current and current[0].startswith("-")
        if word.startswith("-") or (opens_option and ("=" in current[0] or len(current) == 2)):
            lines.append([word])
        else:
            current.append(word)
    rendered = [shlex.join(words) for words in lines if words]
    return [text + " \\" for text in rendered[:-1]] + rendered[-1:]


def choose(
    definition: ImageDefinition, patches: Sequence[Patch], *, override: Strategy | None, base_available: bool
) -> tuple[Strategy, str]:
    """The strategy and the reason for it; an error when an override would ship a wrong image."""
    kinds: dict[ChangeKind, list[str]] = {k: [] for k in ChangeKind}
    for patch in patches:
        for path in patch.paths:
            kinds[classify(path)].append(f"{patch.name}: {path}")
    requested = override or definition.strategy
    native, build = kinds[ChangeKind.NATIVE], kinds[ChangeKind.BUILD]
    if requested in (Strategy.OVERLAY, Strategy.PRECOMPILED) and native:
        raise VpatchError(
            f"strategy {requested.value} cannot ship native code, but the series changes {native[0]}",
            hint="use --strategy source (or strategy: auto) for a series that touches csrc/, CMake or other native code",
        )
    if requested is Strategy.OVERLAY and build:
        raise VpatchError(
            f"strategy overlay copies package files only, but the series changes {build[0]}",
            hint="use --strategy precompiled or source: this change needs vLLM's own image build",
        )
    if requested is not Strategy.AUTO:
        source = "--strategy" if override else f"strategy: {requested.value} in {definition.path.name}"
        return requested, f"requested by {source}"
    if native:
        return Strategy.SOURCE, f"the series changes native code ({native[0]}); only a source build ships it"
    if build:
        return Strategy.PRECOMPILED, f"the series changes build or dependency files ({build[0]}); vLLM's image build must run"
    if not base_available:
        return Strategy.PRECOMPILED, "every patch changes only Python package files, but there is no official image for the pin"
    return Strategy.OVERLAY, "every patch changes only files of the vllm/ package; the patched files are copied onto the official image"


def declared_args(dockerfile_text: str) -> set[str]:
    """The build args a Dockerfile declares (every ARG line, in any stage)."""
    names: set[str] = set()
    for match in _ARG.finditer(dockerfile_text):
        for item in match.group(1).split():
            names.add(item.split("=", 1)[0])
    return names


def vllm_buildargs(
    definition: ImageDefinition, strategy: Strategy, *, wheel_commit: str | None, declared: set[str]
) -> tuple[dict[str, str], list[str]]:
    """Build args for vLLM's docker/Dockerfile, checked against what the pin's Dockerfile declares.
    `wheel_commit`: vLLM's commit whose precompiled wheels to use (None: unknown)."""
    sb = definition.source_build
    wanted: dict[str, str] = {}
    notes: list[str] = []
    if strategy is Strategy.PRECOMPILED:
        flag = _first_declared(PRECOMPILED_ARGS, declared, what="the precompiled switch")
        commit = _first_declared(WHEEL_COMMIT_ARGS, declared, what="the precompiled wheel commit")
        if wheel_commit is None:
            raise VpatchError(
                "the precompiled wheel commit is unknown: the pin comes from the release history, whose "
                "commits are vpatch's own, not vLLM's",
                hint="set source_build.wheel_commit to vLLM's commit of the pinned release, or use --strategy source",
            )
        wanted[flag] = "1"
        wanted[commit] = wheel_commit
    else:
        wanted["torch_cuda_arch_list"] = sb.torch_cuda_arch_list
        if sb.max_jobs is not None:
            wanted["max_jobs"] = str(sb.max_jobs)
        if sb.nvcc_threads is not None:
            wanted["nvcc_threads"] = str(sb.nvcc_threads)
    # vLLM's wheel size check fails a local build for reasons that do not matter for a private image.
    wanted["RUN_WHEEL_CHECK"] = "false"
    args: dict[str, str] = {}
    for key, value in wanted.items():
        if key in declared:
            args[key] = value
        elif strategy is Strategy.SOURCE and key == "torch_cuda_arch_list":
            raise VpatchError(
                f"the pin's {sb.dockerfile} declares no torch_cuda_arch_list build arg",
                hint="a source build would compile every default architecture; check the Dockerfile at the pin",
            )
        else:
            notes.append(f"{sb.dockerfile} at the pin declares no {key}; not passed")
    return args, notes


def _first_declared(names: Sequence[str], declared: set[str], *, what: str) -> str:
    for name in names:
        if name in declared:
            return name
    raise VpatchError(
        f"vLLM's Dockerfile at the pin declares none of {', '.join(names)} ({what})",
        hint="this vLLM cannot build from a precompiled wheel; use --strategy source",
    )


def content_hash(
    *, strategy: Strategy, base_identity: str | None, pin_commit: str, patches: Sequence[Patch], recipe: Mapping[str, str]
) -> str:
    """A short hash of everything that decides the image's content: same inputs, same tag."""
    h = hashlib.sha256()
    for part in (RECIPE_VERSION, strategy.value, base_identity or "", pin_commit):
        h.update(part.encode() + b"\0")
    for patch in patches:
        h.update(f"{patch.number:04d}\0{patch.slug}\0{patch.sha256}\0".encode())
    for key in sorted(recipe):
        h.update(f"{key}={recipe[key]}\0".encode())
    return h.hexdigest()[:12]


def labels(
    definition: ImageDefinition,
    *,
    strategy: Strategy,
    version: str,
    pin_ref: str,
    pin_commit: str,
    source: str,
    patches: Sequence[Patch],
    base_name: str | None,
    base_digest: str | None,
    content: str,
    package_dir: str | None,
) -> dict[str, str]:
    """OCI labels (overriding the base's) and vpatch's own: the pin, each patch and the strategy."""
    out = {
        "org.opencontainers.image.version": f"{version}-vp{content}",
        "org.opencontainers.image.revision": pin_commit,
        "org.opencontainers.image.source": source,
        "org.opencontainers.image.base.name": base_name or "",
        "org.opencontainers.image.base.digest": base_digest or "",
        f"{LABEL_PREFIX}.image": definition.name,
        f"{LABEL_PREFIX}.strategy": strategy.value,
        f"{LABEL_PREFIX}.pin.ref": pin_ref,
        f"{LABEL_PREFIX}.pin.commit": pin_commit,
        f"{LABEL_PREFIX}.content": content,
        f"{LABEL_PREFIX}.patches": ",".join(p.name for p in patches),
    }
    if package_dir:
        out[f"{LABEL_PREFIX}.package_dir"] = package_dir
    for patch in patches:
        out[f"{LABEL_PREFIX}.patch.{patch.number:04d}"] = f"{patch.slug} sha256:{patch.sha256}"
    return out


def in_package(path: str) -> str:
    """vllm/a/b.py -> a/b.py: the path inside the installed package folder."""
    parts = PurePosixPath(path).parts
    assert parts[0] == PACKAGE, path
    return str(PurePosixPath(*parts[1:]))


def version_of(pin_ref: str, pin_commit: str) -> str:
    """The version part of the content tag: 0.29.0 for v0.29.0, a short commit otherwise."""
    if re.fullmatch(r"v?\d+\.\d+\.\d+[0-9A-Za-z.+-]*", pin_ref):
        return pin_ref.removeprefix("v").replace("+", "_")
    return pin_commit[:12]


def describe(plan: BuildPlan, command: str) -> list[str]:
    """The plan as the lines `vpatch build --plan` shows."""
    lines = [
        f"image:     {plan.image.name} ({plan.image.path.name})",
        f"pin:       {plan.pin_ref} ({plan.pin_commit[:12]})",
        f"patches:   {', '.join(p.name for p in plan.patches) or '(none)'}",
        f"strategy:  {plan.strategy.value}",
        f"reason:    {plan.reason}",
    ]
    if plan.base:
        lines.append(f"base:      {plan.base}")
    if plan.base_facts:
        lines.append(f"package:   {plan.base_facts.package_dir}")
    if plan.strategy is Strategy.OVERLAY:
        for path in plan.changes.written:
            lines.append(f"  {'add' if path in plan.changes.added else 'copy':<6} {path}")
        for path in plan.changes.deleted:
            lines.append(f"  delete {path}")
    lines.append("tags:")
    lines += [f"  {tag}" for tag in plan.tags]
    lines.append("command:")
    lines += [f"  {part}" for part in wrap_command(command)]
    lines += [f"note: {note}" for note in plan.notes]
    return lines
