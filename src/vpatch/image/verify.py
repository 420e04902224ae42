"""Check an image against its own labels: the pin, each patch, each patched file, optionally the probes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping
from pathlib import PurePosixPath

from vpatch.config import Config
from vpatch.errors import VpatchError
from vpatch.image.build import expected_files
from vpatch.image.definition import Strategy
from vpatch.image.docker import Docker
from vpatch.image.plan import LABEL_PREFIX, PACKAGE, Changes, in_package
from vpatch.series import Patch, Series


@dataclass(frozen=True)
class Check:
    what: str
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class Report:
    image: str
    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


def verify_image(config: Config, image: str, *, probes: bool = False, docker: Docker | None = None) -> Report:
    """Every check of `vpatch verify`; raises only when the image cannot be checked at all."""
    from vpatch import upstream

    docker = docker or Docker.connect()
    info = docker.image(image)
    labels = info.labels
    pin_commit = labels.get(f"{LABEL_PREFIX}.pin.commit")
    if not pin_commit:
        raise VpatchError(f"image {image} carries no vpatch labels", hint="only images made by `vpatch build` can be verified")
    checks: list[Check] = []
    series = Series.load(config.patches_dir)
    patches, patch_checks = _labelled_patches(labels, series)
    checks += patch_checks
    if not all(c.ok for c in patch_checks):
        return Report(image, tuple(checks))

    repo = upstream.open_upstream(config)
    changes = Changes.of(patches).within(PACKAGE)
    _pre, post = expected_files(repo, pin_commit, patches, changes.paths)
    package_dir = labels.get(f"{LABEL_PREFIX}.package_dir") or _discover(docker, info.id)
    in_image = {p: f"{package_dir}/{in_package(p)}" for p in changes.paths}
    found = docker.read_files(info.id, list(in_image.values()))
    for path in changes.paths:
        actual, wanted = found[in_image[path]], post[path]
        if actual == wanted:
            checks.append(Check(path, True, "deleted as the series says" if wanted is None else ""))
        elif wanted is None:
            checks.append(Check(path, False, "the series deletes it, but the image has it"))
        elif actual is None:
            checks.append(Check(path, False, "missing from the image"))
        else:
            checks.append(Check(path, False, "differs from the pin plus the series"))
    if labels.get(f"{LABEL_PREFIX}.strategy") == Strategy.OVERLAY.value:
        checks += _bytecode_checks(docker, info.id, package_dir, changes)
    if probes:
        checks += _probe_checks(docker, info.id, patches)
    return Report(image, tuple(checks))


def _labelled_patches(labels: Mapping[str, str], series: Series) -> tuple[tuple[Patch, ...], list[Check]]:
    """The project's patch files the image's labels name, each checked against the recorded sha256."""
    names = [n for n in labels.get(f"{LABEL_PREFIX}.patches", "").split(",") if n]
    by_name = {p.name: p for p in series}
    patches: list[Patch] = []
    checks: list[Check] = []
    for name in names:
        number = name.split("-", 1)[0]
        recorded = labels.get(f"{LABEL_PREFIX}.patch.{number}", "")
        digest = recorded.rsplit("sha256:", 1)[-1]
        patch = by_name.get(name)
        if patch is None:
            checks.append(Check(f"patch {name}", False, "not in the project's series any more"))
        elif patch.sha256 != digest:
            checks.append(Check(f"patch {name}", False, "the patch file changed since the image was built"))
        else:
            patches.append(patch)
            checks.append(Check(f"patch {name}", True, f"sha256:{digest[:12]}"))
    return tuple(patches), checks


def _bytecode_checks(docker: Docker, image_id: str, package_dir: str, changes: Changes) -> list[Check]:
    """No bytecode of a changed module may survive: python could load it instead of the patched source."""
    checks: list[Check] = []
    for path in changes.paths:
        if not path.endswith(".py"):
            continue
        rel = PurePosixPath(in_package(path))
        cache = f"{package_dir}/{rel.parent}/__pycache__" if str(rel.parent) != "." else f"{package_dir}/__pycache__"
        stale = [n for n in docker.list_dir(image_id, cache) if n.startswith(f"{rel.stem}.") and n.endswith(".pyc")]
        checks.append(Check(f"{path} bytecode", not stale, f"stale {', '.join(stale)}" if stale else "none stale"))
    return checks


def _probe_checks(docker: Docker, image_id: str, patches: tuple[Patch, ...]) -> list[Check]:
    """Run each patch's probe with the image's python: exit 0 means the patched behaviour is there."""
    from vpatch.image.docker import DockerError

    checks: list[Check] = []
    for patch in patches:
        probe = patch.probe_path
        if probe is None:
            continue
        if not probe.is_file():
            checks.append(Check(f"probe of {patch.name}", False, f"{probe.name} not found next to the patch"))
            continue
        try:
            docker.run(image_id, ["python3", "-c", probe.read_text(encoding="utf-8")])
        except DockerError as exc:
            checks.append(Check(f"probe of {patch.name}", False, exc.message.splitlines()[-1]))
        else:
            checks.append(Check(f"probe of {patch.name}", True, probe.name))
    return checks


def _discover(docker: Docker, image_id: str) -> str:
    from vpatch.image.build import _DISCOVER

    return docker.run(image_id, _DISCOVER).decode().strip()

