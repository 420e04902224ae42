"""Produce the image a plan describes: verify the base, build, tag, label, push."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from vpatch import git, upstream
from vpatch.base import ConfigError, Progress, VpatchError
from vpatch.config import Base, Config, ImageDefinition, Strategy, image_reference_ok
from vpatch.docker import BuildKitInvocation, Docker, DockerError, buildkit_cli, buildkit_invocation
from vpatch.image import base as image_base
from vpatch.image.plan import (
    LABEL_PREFIX,
    PACKAGE,
    BaseFacts,
    BuildPlan,
    Changes,
    choose,
    content_hash,
    declared_args,
    in_package,
    labels,
    version_of,
    vllm_buildargs,
)
from vpatch.series import Series
from vpatch.tree import apply_series

OVERLAY_DOCKERFILE = "Dockerfile"



@dataclass(frozen=True)
class Inputs:
    """Everything a build reads from the project and upstream, loaded once."""

    config: Config
    definition: ImageDefinition
    series: Series
    upstream: Path
    pin_commit: str


@dataclass(frozen=True)
class BuildResult:
    plan: BuildPlan
    image_id: str
    reused: bool  # the content tag already existed with the same content: nothing was built
    pushed: Mapping[str, str | None] = field(default_factory=dict)  # tag -> manifest digest
    seconds: float = 0.0


def load_inputs(config: Config, name: str) -> Inputs:

    definition = ImageDefinition.load(config.root, name)
    series = Series.load(config.patches_dir)
    repo = upstream.open_upstream(config)
    # the recorded commit is checked like everywhere (one gone from upstream is explained with the fix); a moved
    # tag is accepted: the image is built from what the project pinned, as `vpatch apply` does
    pin_commit = upstream.pin_commit(repo, config, moved_ok=True)
    return Inputs(config, definition, series, repo, pin_commit)


@dataclass(frozen=True)
class _Recipe:
    """The strategy-specific half of a plan."""

    buildargs: dict[str, str]
    dockerfile: str
    context: str
    target: str | None
    recipe: dict[str, str]  # what, besides pin and patches, decides the content
    identity: str | None  # the base's digest or id (overlay); None where the pin's Dockerfile is the base
    base_name: str | None = None
    base_digest: str | None = None
    package_dir: str | None = None
    facts: BaseFacts | None = None


def make_plan(
    inputs: Inputs,
    *,
    strategy: Strategy | None = None,
    base: str | None = None,
    docker: Docker | None = None,
    require_base: bool = False,
) -> BuildPlan:
    """The build that `vpatch build` would run. Without a daemon (or base) the overlay plan says so in its notes;
    `require_base` turns that into an error, for real builds."""
    definition, pin_commit, pin_ref = inputs.definition, inputs.pin_commit, inputs.config.pin.ref
    patches = tuple(inputs.series.patches)
    if base is not None and not image_reference_ok(base):
        raise VpatchError(f"--base {base!r} is not an image reference",
                          hint="[registry/]name[:tag][@sha256:...], the name in lower case, e.g. vllm/vllm-openai:v0.31.0")
    chosen_base = Base(image=base) if base else definition.base_for(pin_ref, pin_commit)
    chosen, reason = choose(definition, patches, override=strategy, base_available=chosen_base.image is not None)
    version = version_of(pin_ref, pin_commit)
    notes: list[str] = []
    changes = Changes.of(patches)
    if chosen is Strategy.OVERLAY:
        changes = changes.within(PACKAGE)  # tests and docs a patch may also touch are not in the image
        r = _overlay_recipe(inputs, chosen_base, changes, docker, notes, require_base=require_base)
    else:
        r = _vllm_recipe(inputs, chosen, notes)
    if r.identity or chosen is not Strategy.OVERLAY:
        content = content_hash(strategy=chosen, base_identity=r.identity, pin_commit=pin_commit, patches=patches,
                               recipe=r.recipe)
    else:
        content = "?" * 12
        notes.append("the content tag needs the base image on the daemon (or base.digest in the definition)")
    repo = definition.full_repository
    return BuildPlan(
        image=definition,
        strategy=chosen,
        reason=reason,
        version=version,
        pin_ref=pin_ref,
        pin_commit=pin_commit,
        patches=patches,
        changes=changes,
        content_hash=content,
        tags=(f"{repo}:{version}-vp{content}", f"{repo}:{definition.tag}"),
        labels=labels(
            definition, strategy=chosen, version=version, pin_ref=pin_ref, pin_commit=pin_commit,
            source=inputs.config.upstream.git, patches=patches, base_name=r.base_name, base_digest=r.base_digest,
            content=content, package_dir=r.package_dir,
        ),
        buildargs=r.buildargs,
        dockerfile=r.dockerfile,
        context=r.context,
        target=r.target,
        base=chosen_base.reference() if chosen is Strategy.OVERLAY else None,
        base_facts=r.facts,
        notes=tuple(notes),
    )


def _overlay_recipe(
    inputs: Inputs, base: Base, changes: Changes, docker: Docker | None, notes: list[str], *, require_base: bool
) -> _Recipe:
    reference = base.reference()
    assert reference is not None
    facts = image_base.base_facts(docker, reference, inputs.definition, base, notes, require=require_base)
    package_dir = facts.package_dir if facts else (inputs.definition.package_dir or "<discovered in the base>")
    recipe_path = inputs.config.root / OVERLAY_DOCKERFILE
    if not recipe_path.is_file():
        raise ConfigError(
            f"no overlay recipe {OVERLAY_DOCKERFILE} in {inputs.config.root}",
            hint="the project's top-level Dockerfile is the overlay recipe; restore it from vpatch's repository",
        )
    notes.append("vpatch runs this build through the docker SDK (classic builder), with the labels as one LABEL step")
    if facts and facts.digest and not base.digest:
        notes.append(f"record the base's digest in {inputs.definition.path.name} (base.digest: {facts.digest}): "
                     "tags move and nightly tags are pruned")
    return _Recipe(
        buildargs={
            "BASE_IMAGE": facts.image_id if facts else reference,
            "VLLM_PACKAGE_DIR": package_dir,
            # one path a line: the recipe reads them line by line, so spaces and glob characters stay literal
            "VPATCH_DELETE": "\n".join(in_package(p) for p in changes.deleted),
            "VPATCH_STALE_MODULES": "\n".join(in_package(p) for p in changes.paths if p.endswith(".py")),
        },
        dockerfile=OVERLAY_DOCKERFILE,
        context=f"<context: {OVERLAY_DOCKERFILE} + overlay/ with {len(changes.written)} file(s)>",
        target=None,
        recipe={"dockerfile": hashlib.sha256(recipe_path.read_bytes()).hexdigest(), "package_dir": package_dir},
        identity=base.digest or ((facts.digest or facts.image_id) if facts else None),
        base_name=base.image,
        base_digest=base.digest or (facts.digest if facts else None),
        package_dir=package_dir,
        facts=facts,
    )


def _vllm_recipe(inputs: Inputs, strategy: Strategy, notes: list[str]) -> _Recipe:
    """precompiled / source: vLLM's own Dockerfile from a work tree of the pin with the series applied."""
    dockerfile_text = _pin_dockerfile(inputs)
    sb = inputs.definition.source_build
    # wheels.vllm.ai knows vLLM's commits: the pin is one only when upstream is vLLM's git.
    wheel_commit = sb.wheel_commit or (inputs.pin_commit if inputs.config.upstream.source == "git" else None)
    buildargs, arg_notes = vllm_buildargs(
        inputs.definition, strategy, wheel_commit=wheel_commit, declared=declared_args(dockerfile_text)
    )
    notes += arg_notes
    notes.append("the context is a local clone of upstream at the pin plus one commit per patch "
                 "(vLLM's Dockerfile bind-mounts its .git)")
    context = _context_dir(inputs.config, inputs.definition)
    return _Recipe(
        buildargs=buildargs,
        dockerfile=str(context / sb.dockerfile),
        context=str(context),
        target=sb.target,
        recipe=dict(buildargs) | {"target": sb.target, "dockerfile": hashlib.sha256(dockerfile_text.encode()).hexdigest()},
        identity=None,
    )


def build(
    inputs: Inputs,
    plan: BuildPlan,
    docker: Docker,
    *,
    push: bool = False,
    progress: Progress | None = None,
) -> BuildResult:
    """Build the planned image (or reuse it when its content tag exists), tag it, and push it if asked."""
    started = time.monotonic()
    reused = False
    existing = docker.image(plan.content_tag) if docker.has_image(plan.content_tag) else None
    if existing and existing.labels.get(f"{LABEL_PREFIX}.content") == plan.content_hash:
        image_id, reused = existing.id, True
    elif plan.strategy is Strategy.OVERLAY:
        image_id = _build_overlay(inputs, plan, docker, progress)
    else:
        image_id = _build_with_vllm_dockerfile(inputs, plan, docker, progress)
    for tag in plan.tags[1:]:
        docker.tag(image_id, tag)
    pushed: dict[str, str | None] = {}
    if push:
        if not plan.image.registry:
            raise ConfigError(
                f"{plan.image.path.name} names no registry to push to",
                hint="add image.registry (host[:port]) to the image definition",
            )
        for tag in plan.tags:
            pushed[tag] = docker.push(tag, progress)
    return BuildResult(plan, image_id, reused, pushed, time.monotonic() - started)


SYMLINK_MODE, EXECUTABLE_MODE = "120000", "100755"


def _build_overlay(inputs: Inputs, plan: BuildPlan, docker: Docker, progress: Progress | None) -> str:
    if plan.base_facts is None:
        raise DockerError(f"base image {plan.base} is not on the docker daemon", hint=f"docker pull {plan.base}")
    pre, post, modes = image_base.expected_entries(inputs.upstream, inputs.pin_commit, plan.patches, plan.changes.paths)
    image_base.verify_base(docker, plan, pre)
    with tempfile.TemporaryDirectory(prefix="vpatch-overlay-") as tmp:
        context = Path(tmp)
        # One LABEL instruction, appended to the recipe: the builder's own labels option costs a step per label.
        all_labels = dict(plan.labels) | {"org.opencontainers.image.created": _now()}
        recipe = (inputs.config.root / OVERLAY_DOCKERFILE).read_text(encoding="utf-8").rstrip("\n")
        (context / OVERLAY_DOCKERFILE).write_text(f"{recipe}\n{label_instruction(all_labels)}\n", encoding="utf-8")
        overlay = context / "overlay"
        overlay.mkdir()
        for path in plan.changes.written:
            data = post[path]
            assert data is not None, path
            target = overlay / in_package(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            # COPY keeps what the context holds: a link stays a link, an executable stays executable
            if modes.get(path) == SYMLINK_MODE:
                target.symlink_to(os.fsdecode(data))
            else:
                target.write_bytes(data)
                target.chmod(0o755 if modes.get(path) == EXECUTABLE_MODE else 0o644)
        return docker.build(
            context,
            tag=plan.content_tag,
            buildargs=plan.buildargs,
            labels={},
            dockerfile=OVERLAY_DOCKERFILE,
            progress=progress,
        )


def _build_with_vllm_dockerfile(inputs: Inputs, plan: BuildPlan, docker: Docker, progress: Progress | None) -> str:

    context = _context_dir(inputs.config, plan.image)
    tree = context.with_name(f"{context.name}.tree")
    applied = apply_series(
        inputs.upstream, inputs.series, ref=inputs.config.pin.ref, base=inputs.pin_commit,
        out=tree, state_dir=context.with_name(f"{context.name}.state"), force=True,
    )
    # A linked work tree's .git is a file naming a folder on this machine, useless inside the build:
    # the context is a standalone clone (objects hard-linked) checked out at the applied series.
    shutil.rmtree(context, ignore_errors=True)
    git.clone_local(inputs.upstream, context)
    git.checkout_detached(context, applied.tip)
    docker.run_buildkit(_invocation(plan, created=_now()), progress)
    return docker.image(plan.content_tag).id


def plan_command(plan: BuildPlan) -> str:
    """The exact build command of the plan, as `--plan` shows it."""
    if plan.strategy is Strategy.OVERLAY:
        return plan.command(("docker", "build"))
    try:
        cli = buildkit_cli()
    except DockerError:
        cli = (["docker", "build"], {"DOCKER_BUILDKIT": "1"})
    return _invocation(plan, created=None, cli=cli).shell_line()


def _invocation(
    plan: BuildPlan, *, created: str | None, cli: tuple[list[str], dict[str, str]] | None = None
) -> BuildKitInvocation:
    extra = {"org.opencontainers.image.created": created} if created else {}
    return buildkit_invocation(
        context=Path(plan.context),
        dockerfile=Path(plan.dockerfile),
        tags=plan.tags,
        buildargs=plan.buildargs,
        labels=dict(plan.labels) | extra,
        target=plan.target,
        cli=cli,
    )


def label_instruction(labels: Mapping[str, str]) -> str:
    """A single Dockerfile LABEL instruction setting every label (JSON strings are valid quoted words)."""

    return "LABEL " + " ".join(
        f"{json.dumps(k, ensure_ascii=False)}={json.dumps(v, ensure_ascii=False)}" for k, v in labels.items()
    )


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pin_dockerfile(inputs: Inputs) -> str:
    path = inputs.definition.source_build.dockerfile
    blob = git.read_blobs(inputs.upstream, inputs.pin_commit, [path])[path]
    if blob is None:
        raise VpatchError(
            f"the pin {inputs.config.pin.ref} has no {path}",
            hint="set source_build.dockerfile in the image definition to vLLM's Dockerfile at this pin",
        )
    return blob.decode("utf-8", "replace")


def _context_dir(config: Config, definition: ImageDefinition) -> Path:
    return config.state_dir / "image" / definition.name




def plan_build(config: Config, name: str, *, strategy: Strategy | None = None, base: str | None = None) -> BuildPlan:
    """`vpatch build --plan`: the plan, using the daemon when it answers (overlay needs it for the tags)."""
    inputs = load_inputs(config, name)
    docker: Docker | None
    try:
        docker = Docker.connect()
    except DockerError:
        docker = None
    return make_plan(inputs, strategy=strategy, base=base, docker=docker)


def build_image(
    config: Config,
    name: str,
    *,
    strategy: Strategy | None = None,
    base: str | None = None,
    push: bool = False,
    progress: Progress | None = None,
) -> BuildResult:
    """`vpatch build`: plan, verify the base, build (or reuse), tag and push."""
    inputs = load_inputs(config, name)
    docker = Docker.connect()
    plan = make_plan(inputs, strategy=strategy, base=base, docker=docker, require_base=True)
    return build(inputs, plan, docker, push=push, progress=progress)
