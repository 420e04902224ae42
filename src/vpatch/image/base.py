"""The base image and what an image built on it must hold: the facts read from the base (its id, digest and
where it installs vllm/), the check that its copies of the touched files are the pin's, and the files the
series makes of them (from git alone), which build writes and verify compares."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from vpatch import git
from vpatch.base import ApplyError, VpatchError, atomic_write, cache_dir
from vpatch.config import Base, ImageDefinition
from vpatch.docker import Docker, DockerError
from vpatch.image import find_vllm
from vpatch.image.plan import BaseFacts, BuildPlan, in_package
from vpatch.series import Patch


class BaseMismatchError(VpatchError):
    """The base image's copy of a touched file is not the pin's: patching it would ship a wrong image."""


def expected_files(
    upstream: Path, pin_commit: str, patches: Sequence[Patch], paths: Sequence[str]
) -> tuple[dict[str, bytes | None], dict[str, bytes | None]]:
    """The pin's copies of `paths` and their copies after the series (None: absent), from git alone."""
    pre, post, _modes = expected_entries(upstream, pin_commit, patches, paths)
    return pre, post


def expected_entries(
    upstream: Path, pin_commit: str, patches: Sequence[Patch], paths: Sequence[str]
) -> tuple[dict[str, bytes | None], dict[str, bytes | None], dict[str, str]]:
    """As expected_files, plus the git mode of each file after the series (100644, 100755, or 120000 for a
    symlink, whose "content" is its target): the overlay must carry exec bits and links, not just bytes."""
    pre = git.read_blobs(upstream, pin_commit, list(paths))
    with git.temp_index(upstream) as env:
        git.load_index(upstream, env, pin_commit, list(paths))
        for patch in patches:
            result = git.apply_cached(upstream, env, patch.diff, check=False)
            if result.returncode != 0:
                raise ApplyError(
                    f"patch {patch.name} does not apply to the pin ({pin_commit[:12]}): {result.err.strip()}",
                    hint="vpatch apply --keep to see the conflict",
                )
        tree = git.write_tree(upstream, env)
    post = git.read_blobs(upstream, tree, list(paths))
    modes = {path: mode for mode, _kind, _sha, path in git.ls_tree(upstream, tree, list(paths))}
    return pre, post, modes


def verify_base(docker: Docker, plan: BuildPlan, pre: Mapping[str, bytes | None]) -> None:
    """Refuse a base whose copies of the touched files are not the pin's (before any layer is written)."""
    assert plan.base_facts is not None
    facts = plan.base_facts
    in_image = {p: f"{facts.package_dir}/{in_package(p)}" for p in pre}
    found = docker.read_files(facts.image_id, list(in_image.values()))
    wrong: list[str] = []
    for path, pinned in pre.items():
        actual = found[in_image[path]]
        if actual == pinned:
            continue
        if pinned is None:
            wrong.append(f"{path} exists in the base but not at the pin")
        elif actual is None:
            wrong.append(f"{path} is missing from the base")
        else:
            wrong.append(f"{path} differs")
    if wrong:
        raise BaseMismatchError(
            f"base image {plan.base} is not the pinned vLLM {plan.pin_ref}: " + "; ".join(wrong[:5])
            + (f" (and {len(wrong) - 5} more)" if len(wrong) > 5 else ""),
            hint=f"use the official image of {plan.pin_ref} as the base (base.image / --base), or move the pin to the base's vLLM",
        )


def base_facts(
    docker: Docker | None, reference: str, definition: ImageDefinition, base: Base, notes: list[str], *, require: bool
) -> BaseFacts | None:
    if docker is None:
        if require:
            raise DockerError("the docker daemon is not reachable")
        notes.append("no docker daemon: the base was not inspected")
        return None
    if not docker.has_image(reference):
        if require:
            docker.image(  # raises the missing-image error
                reference,
                missing_hint=f"pull it first (`docker pull {reference}`), or name a local copy with --base or base.image",
            )
        notes.append(f"base image {reference} is not on the daemon")
        return None
    info = docker.image(reference)
    if base.digest and info.digest and info.digest != base.digest:
        raise VpatchError(
            f"base image {base.image} has digest {info.digest}, not the recorded {base.digest}",
            hint="the tag moved; pull the recorded digest or update base.digest in the image definition",
        )
    package_dir = definition.package_dir or discover_package_dir(docker, info.id, reference)
    return BaseFacts(reference=reference, image_id=info.id, digest=info.digest, package_dir=package_dir)


def discover_package_dir(docker: Docker, image_id: str, reference: str) -> str:
    """Where `image_id` installs vllm/: asked of the image's own python once per image id (ids are content
    hashes, so the answer never goes stale)."""

    memo = cache_dir() / "image-facts" / f"{image_id.replace(':', '-')}.package_dir"
    if memo.is_file():
        return memo.read_text(encoding="utf-8").strip()
    # the base's own python says where vllm/ is, without importing it (image/find_vllm.py, this very file)
    found = docker.run(image_id, ("python3", "-c", Path(find_vllm.__file__).read_text(encoding="utf-8"))).decode().strip()
    if not found.startswith("/"):
        raise VpatchError(
            f"base image {reference} has no importable vllm package",
            hint="is it a vLLM image? set package_dir in the image definition if python3 cannot find it",
        )
    atomic_write(memo, found.encode() + b"\n")
    return found
