"""Check an image against its own labels: the pin, each patch, each patched file, optionally the probes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from vpatch import upstream
from vpatch.base import VpatchError
from vpatch.config import Config, Strategy
from vpatch.docker import Docker
from vpatch.image.base import discover_package_dir, expected_entries
from vpatch.image.plan import LABEL_PREFIX, PACKAGE, Changes, in_package
from vpatch.probes import Place, ProbeKind, ProbeOutcome, Ran, argv, interpret, probe_for
from vpatch.series import Patch, Series

if TYPE_CHECKING:
    from vpatch.probes import Place, Probe, Ran


class CheckKind(str, Enum):
    PATCH = "patch"  # the labelled patch file is the project's
    FILE = "file"  # a touched file holds the pin plus the series
    BYTECODE = "bytecode"  # no stale .pyc of a changed module
    PROBE = "probe"  # the patch's landing probe passes on the image


@dataclass(frozen=True)
class LabelCheck:
    kind: CheckKind
    what: str
    ok: bool
    detail: str = ""
    error: bool = False  # could not decide (a probe's ERROR): not ok, and not "the bug is there" either

    @property
    def mark(self) -> str:
        return "ok  " if self.ok else "ERROR" if self.error else "FAIL"


@dataclass(frozen=True)
class VerifyReport:
    image: str
    checks: tuple[LabelCheck, ...]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


def verify_image(config: Config, image: str, *, probes: bool = False, docker: Docker | None = None) -> VerifyReport:
    """Every check of `vpatch verify`; raises only when the image cannot be checked at all."""

    docker = docker or Docker.connect()
    info = docker.image(image)
    labels = info.labels
    pin_commit = labels.get(f"{LABEL_PREFIX}.pin.commit")
    if not pin_commit:
        raise VpatchError(f"image {image} carries no vpatch labels", hint="only images made by `vpatch build` can be verified")
    checks: list[LabelCheck] = []
    series = Series.load(config.patches_dir)
    patches, patch_checks = _labelled_patches(labels, series)
    checks += patch_checks
    if not all(c.ok for c in patch_checks):
        return VerifyReport(image, tuple(checks))

    repo = upstream.open_upstream(config)
    changes = Changes.of(patches).within(PACKAGE)
    _pre, post, modes = expected_entries(repo, pin_commit, patches, changes.paths)
    package_dir = labels.get(f"{LABEL_PREFIX}.package_dir") or discover_package_dir(docker, info.id, image)
    in_image = {p: f"{package_dir}/{in_package(p)}" for p in changes.paths}
    found = docker.read_entries(info.id, list(in_image.values()))
    for path in changes.paths:
        entry, wanted = found[in_image[path]], post[path]
        if entry is None and wanted is None:
            checks.append(LabelCheck(CheckKind.FILE, path, True, "deleted as the series says"))
        elif wanted is None:
            checks.append(LabelCheck(CheckKind.FILE, path, False, "the series deletes it, but the image has it"))
        elif entry is None:
            checks.append(LabelCheck(CheckKind.FILE, path, False, "missing from the image"))
        elif entry.data != wanted:
            checks.append(LabelCheck(CheckKind.FILE, path, False, "differs from the pin plus the series"))
        elif entry.mode != modes.get(path):
            checks.append(LabelCheck(CheckKind.FILE, path, False, f"{_kind(entry.mode)} in the image, but "
                                f"{_kind(modes.get(path, '100644'))} in the pin plus the series"))
        else:
            checks.append(LabelCheck(CheckKind.FILE, path, True, ""))
    if labels.get(f"{LABEL_PREFIX}.strategy") == Strategy.OVERLAY.value:
        checks += _bytecode_checks(docker, info.id, package_dir, changes)
    if probes:
        checks += _probe_checks(docker, info.id, package_dir, patches)
    return VerifyReport(image, tuple(checks))


def _kind(mode: str) -> str:
    return {"120000": "a symlink", "100755": "an executable file"}.get(mode, "a plain (non-executable) file")


def _labelled_patches(labels: Mapping[str, str], series: Series) -> tuple[tuple[Patch, ...], list[LabelCheck]]:
    """The project's patch files the image's labels name, each checked against the recorded sha256."""
    names = [n for n in labels.get(f"{LABEL_PREFIX}.patches", "").split(",") if n]
    by_name = {p.name: p for p in series}
    patches: list[Patch] = []
    checks: list[LabelCheck] = []
    for name in names:
        number = name.split("-", 1)[0]
        recorded = labels.get(f"{LABEL_PREFIX}.patch.{number}", "")
        digest = recorded.rsplit("sha256:", 1)[-1]
        patch = by_name.get(name)
        if patch is None:
            checks.append(LabelCheck(CheckKind.PATCH, f"patch {name}", False, "not in the project's series any more"))
        elif patch.sha256 != digest:
            checks.append(LabelCheck(CheckKind.PATCH, f"patch {name}", False, "the patch file changed since the image was built"))
        else:
            patches.append(patch)
            checks.append(LabelCheck(CheckKind.PATCH, f"patch {name}", True, f"sha256:{digest[:12]}"))
    return tuple(patches), checks


def _bytecode_checks(docker: Docker, image_id: str, package_dir: str, changes: Changes) -> list[LabelCheck]:
    """No bytecode of a changed module may survive: python could load it instead of the patched source."""
    checks: list[LabelCheck] = []
    for path in changes.paths:
        if not path.endswith(".py"):
            continue
        rel = PurePosixPath(in_package(path))
        cache = f"{package_dir}/{rel.parent}/__pycache__" if str(rel.parent) != "." else f"{package_dir}/__pycache__"
        stale = [n for n in docker.list_dir(image_id, cache) if n.startswith(f"{rel.stem}.") and n.endswith(".pyc")]
        checks.append(LabelCheck(CheckKind.BYTECODE, f"{path} bytecode", not stale,
                            f"stale {', '.join(stale)}" if stale else "none stale"))
    return checks


def _probe_checks(docker: Docker, image_id: str, package_dir: str, patches: tuple[Patch, ...]) -> list[LabelCheck]:
    """Each patch's landing probe, run against the image instead of a tree, read by the same rules as on a
    tree: it must pass (the fix is in); an error is an error, never "the bug is there"."""

    checks: list[LabelCheck] = []
    for patch in patches:
        what = f"probe of {patch.name}"
        try:
            probe = probe_for(patch)
        except VpatchError as exc:
            checks.append(LabelCheck(CheckKind.PROBE, what, False, exc.message, error=True))
            continue
        if probe is None:
            continue
        outcome, detail = interpret(probe, image_place(docker, image_id, package_dir))
        last = (detail.strip().splitlines() or [""])[-1] if probe.kind is ProbeKind.COMMAND else detail
        checks.append(LabelCheck(CheckKind.PROBE, what, outcome is ProbeOutcome.PASS,
                            f"{probe.name}: {outcome.value}" + (f" ({last})" if last else ""),
                            error=outcome is ProbeOutcome.ERROR))
    return checks


def image_place(docker: Docker, image_id: str, package_dir: str) -> Place:
    """An image as the place a probe runs: a tree path vllm/x is read from the installed package (a path
    outside vllm/ is not in the image: missing), and a command runs with the image's python3 and the folder
    holding vllm/ as the tree (cwd, PYTHONPATH). The probe's requirements are not installed: the image has
    vLLM's own dependencies. Moves are not followed: the image holds the files as the series left them."""

    tree = str(PurePosixPath(package_dir).parent)

    def read(paths: Sequence[str]) -> Mapping[str, bytes | None]:
        inside = {p: f"{package_dir}/{in_package(p)}" for p in paths if p.startswith(f"{PACKAGE}/")}
        found = docker.read_files(image_id, list(inside.values())) if inside else {}
        return {p: found[inside[p]] if p in inside else None for p in paths}

    def run(probe: Probe) -> Ran:
        probe_dir = "/tmp/vpatch-probes"
        files = {f"{probe_dir}/{p.name}": p.read_bytes() for p in (probe.path, *probe.referenced_files())}
        result = docker.execute(image_id, argv(probe, python="python3", probe_dir=probe_dir, tree=tree), files=files,
                                workdir=tree, timeout=probe.timeout,
                                env={"PYTHONPATH": tree, "PYTHONDONTWRITEBYTECODE": "1"})
        # execute() answers 124 for a run past the timeout
        return Ran(result.returncode, result.stdout + result.stderr, timed_out=result.returncode == 124)

    return Place("image", read, run)
