"""Check an image against its own labels: the pin, each patch, each patched file, optionally the probes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Mapping

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
        checks += _probe_checks(docker, info.id, package_dir, patches)
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


def _probe_checks(docker: Docker, image_id: str, package_dir: str, patches: tuple[Patch, ...]) -> list[Check]:
    """Each patch's landing probe, run against the image instead of a tree: it must pass (the fix is in)."""
    checks: list[Check] = []
    for patch in patches:
        probe = patch.probe_path
        if probe is None:
            continue
        what = f"probe of {patch.name}"
        try:
            spec = _load_probe(probe)
            kind = spec.get("kind")
            if kind == "files":
                ok, detail = _files_probe(docker, image_id, package_dir, spec)
            elif kind == "command":
                ok, detail = _command_probe(docker, image_id, package_dir, probe, spec)
            else:
                ok, detail = False, f"{probe.name}: unknown probe kind {kind!r}"
        except VpatchError as exc:
            ok, detail = False, exc.message
        checks.append(Check(what, ok, detail))
    return checks


def _load_probe(path: Path) -> dict[str, Any]:
    import yaml

    try:
        spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise VpatchError(f"{path.name}: cannot read the probe: {exc}") from exc
    if not isinstance(spec, dict):
        raise VpatchError(f"{path.name}: a probe is a mapping with a 'kind'")
    return spec


def _files_probe(docker: Docker, image_id: str, package_dir: str, spec: dict[str, Any]) -> tuple[bool, str]:
    """kind: files — must-contain / must-not-contain per file, read from the installed package."""
    rules: dict[str, Any] = spec.get("files") or {}
    outside = [p for p in rules if not p.startswith(f"{PACKAGE}/")]
    if outside:
        return False, f"{outside[0]} is not part of the installed package; the probe cannot run on an image"
    found = docker.read_files(image_id, [f"{package_dir}/{in_package(p)}" for p in rules])
    for path, rule in rules.items():
        content = found[f"{package_dir}/{in_package(path)}"]
        text = content.decode("utf-8", "replace") if content is not None else None
        for needle in rule.get("contains", []) or []:
            if text is None or needle not in text:
                return False, f"{path} lacks {needle!r}"
        for needle in rule.get("not_contains", []) or []:
            if text is not None and needle in text:
                return False, f"{path} still has {needle!r}"
    return True, f"{len(rules)} file(s) as the fix leaves them"


def _command_probe(
    docker: Docker, image_id: str, package_dir: str, probe: Path, spec: dict[str, Any]
) -> tuple[bool, str]:
    """kind: command — run with the image's python, cwd and PYTHONPATH at the folder holding vllm/; exit 0 passes."""
    tree = str(PurePosixPath(package_dir).parent)
    probe_dir = "/tmp/vpatch-probes"
    files = {f"{probe_dir}/{p.name}": p.read_bytes() for p in sorted(probe.parent.iterdir()) if p.is_file()}
    try:
        argv = [str(a).format(python="python3", probe_dir=probe_dir, tree=tree) for a in spec.get("run") or []]
    except (KeyError, IndexError) as exc:
        raise VpatchError(f"{probe.name}: unknown placeholder {exc} in run") from exc
    if not argv:
        raise VpatchError(f"{probe.name}: a command probe needs run: [...]")
    result = docker.execute(image_id, argv, files=files, workdir=tree, env={"PYTHONPATH": tree},
                            timeout=float(spec.get("timeout", 600)))
    last = (result.err.strip().splitlines() or result.out.strip().splitlines() or [""])[-1]
    if result.code == 0:
        return True, f"{probe.name}: exit 0"
    return False, f"{probe.name}: exit {result.code}" + (f" ({last})" if last else "")


def _discover(docker: Docker, image_id: str) -> str:
    from vpatch.image.build import _DISCOVER

    return docker.run(image_id, _DISCOVER).decode().strip()

