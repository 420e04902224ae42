"""vpatch build / verify against a real docker daemon, on a base image with the official layout."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REAL_CACHE
from helpers.imagebase import FLASH_MODULE, PACKAGE_DIR, PIN, SeriesFiles, ensure_base, make_flash_series, write_project
from typer.testing import CliRunner

from vpatch import git as vgit
from vpatch.base.errors import ConfigError, VpatchError
from vpatch.commands.cli import app
from vpatch.config.definition import ImageDefinition, Strategy
from vpatch.docker import Docker, DockerError, buildkit_invocation

# One worker runs the module: its session fixtures build the base images and the series once.
pytestmark = pytest.mark.xdist_group("image")

REPO_ROOT = Path(__file__).resolve().parents[2]


def _docker_or_skip() -> Docker:
    try:
        return Docker.connect()
    except DockerError as exc:
        if os.environ.get("CI") or shutil.which("dockerd"):
            raise  # CI starts the daemon (.ci/run); a machine with dockerd should run it too
        pytest.skip(f"no docker here ({exc.message}); scripts/start-dockerd installs and starts it")


@pytest.fixture(scope="session")
def docker() -> Docker:
    return _docker_or_skip()


@pytest.fixture(scope="session")
def bases(docker: Docker, release_history: Path) -> dict[str, str]:
    """Test base images for the pin and for the release before it (the wrong base), by version."""
    out = {}
    for version in ("0.29.0", "0.28.0"):
        tag = f"v{version}"
        tree = vgit.run(release_history, ["rev-parse", f"{tag}:vllm"]).out.strip()
        out[version] = ensure_base(
            docker,
            version,
            package_tar=lambda tag=tag: vgit.run(release_history, ["archive", "--format=tar", tag, "vllm"]).stdout,
            fingerprint=tree,
        )
    return out


@pytest.fixture(scope="session")
def flash_series(release_history: Path, tmp_path_factory: pytest.TempPathFactory) -> SeriesFiles:
    return make_flash_series(release_history, tmp_path_factory.mktemp("series"))


@pytest.fixture
def image_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flash_series: SeriesFiles) -> Path:
    """A project pinned at v0.29.0 of the real release history, with the three patches and the repo's
    own images/flash-next.yaml and overlay Dockerfile."""
    monkeypatch.setenv("VPATCH_CACHE", str(REAL_CACHE))
    return write_project(tmp_path / "project", flash_series, REPO_ROOT)


def vpatch(root: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["-C", str(root), *args])
    return result.exit_code, result.output


def content_tag_of(out: str) -> str:
    """The content tag from `vpatch build`'s closing lines ("  <repo>:0.29.0-vp<hash>[  pushed ...]")."""
    return next(line.split()[0] for line in out.splitlines() if line.startswith("  ") and ":0.29.0-vp" in line)


def command_of(plan_output: str) -> str:
    """The build command of `vpatch build --plan`, its continuation lines joined."""
    block = plan_output.split("command:\n", 1)[1].splitlines()
    lines = [line.strip().removesuffix("\\").strip() for line in block if line.startswith("  ")]
    return " ".join(lines)


def definition(root: Path) -> ImageDefinition:
    return ImageDefinition.load(root, "flash-next")


# --- overlay builds ---------------------------------------------------------------------


def test_build_overlays_the_series_onto_the_base(image_project: Path, bases: dict[str, str], docker: Docker,
                                                 flash_series: SeriesFiles) -> None:
    d = definition(image_project)
    # The plan names the tags; drop an image a previous run left so that this one really builds.
    code, out = vpatch(image_project, "build", "flash-next", "--plan", "--base", bases["0.29.0"])
    assert code == 0, out
    planned = content_tag_of(out)
    docker.remove_image(planned)

    code, out = vpatch(image_project, "build", "flash-next", "--base", bases["0.29.0"])
    assert code == 0, out
    assert out.splitlines()[-3].startswith("built in ")
    assert "Step 1/" in out and "COPY overlay/" in out  # the build's progress is streamed
    content_tag = content_tag_of(out)
    assert content_tag == planned
    assert content_tag.startswith(f"{d.full_repository}:0.29.0-vp")
    built = docker.image(content_tag)
    assert f"{d.full_repository}:{d.tag}" in built.tags

    # The patched files are v0.29.0 + the series; the deleted one is gone; no stale bytecode survives.
    paths = {p: f"{PACKAGE_DIR}/{p.removeprefix('vllm/')}" for p in flash_series.expected}
    found = docker.read_files(content_tag, list(paths.values()))
    for path, content in flash_series.expected.items():
        assert found[paths[path]] == content, path
    assert docker.list_dir(content_tag, f"{PACKAGE_DIR}/__pycache__")
    for stale in ("sampling_params", "scripts"):
        assert not [n for n in docker.list_dir(content_tag, f"{PACKAGE_DIR}/__pycache__") if n.startswith(f"{stale}.")]

    labels = built.labels
    assert labels["io.vpatch.patches"] == "0001-top-k-guard,0002-flash-sm120,0003-drop-scripts-shim"
    for number in ("0001", "0002", "0003"):
        assert labels[f"io.vpatch.patch.{number}"].split(" sha256:")[1] == _sha(image_project, number)
    assert labels["io.vpatch.strategy"] == "overlay"
    assert labels["io.vpatch.pin.ref"] == PIN
    # vpatch's OCI labels replace the base's own.
    assert labels["org.opencontainers.image.version"] == content_tag.rsplit(":", 1)[1]
    assert labels["org.opencontainers.image.source"] != "https://example.invalid/base"
    assert labels["org.opencontainers.image.revision"] == labels["io.vpatch.pin.commit"]
    assert labels["org.opencontainers.image.base.name"] == bases["0.29.0"]
    assert labels["org.opencontainers.image.created"]

    # Same inputs, same tag: the second build reuses the image.
    code, again = vpatch(image_project, "build", "flash-next", "--base", bases["0.29.0"])
    assert code == 0 and again.startswith("reused"), again
    assert content_tag in again

    # verify passes on it, probes included.
    code, out = vpatch(image_project, "verify", content_tag, "--probes")
    assert code == 0, out
    assert "ok   probe of 0001-top-k-guard: 0001-top-k-guard.yaml: pass (all 1 file checks hold)" in out
    assert "ok   probe of 0002-flash-sm120: 0002-flash-sm120.yaml: pass" in out


def test_verify_fails_on_an_altered_patched_file(image_project: Path, bases: dict[str, str], docker: Docker,
                                                 tmp_path: Path) -> None:
    code, out = vpatch(image_project, "build", "flash-next", "--base", bases["0.29.0"])
    assert code == 0, out
    content_tag = content_tag_of(out)
    context = tmp_path / "alter"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {content_tag}\nCOPY vpatch_flash.py {PACKAGE_DIR}/vpatch_flash.py\n")
    (context / "vpatch_flash.py").write_text(FLASH_MODULE.replace("FLASH_ATTN", "TRITON_ATTN"))
    altered = "vpatch-test/altered:1"
    docker.build(context, tag=altered, buildargs={}, labels={})
    try:
        code, out = vpatch(image_project, "verify", altered, "--probes")
        assert code == 1, out
        assert "FAIL vllm/vpatch_flash.py: differs from the pin plus the series" in out
        assert "ok   vllm/sampling_params.py" in out
        assert "FAIL probe of 0002-flash-sm120: 0002-flash-sm120.yaml: fail" in out
        assert "ok   probe of 0001-top-k-guard" in out
    finally:
        docker.remove_image(altered)
    # A probe that crashes (a traceback, exit 1) is an ERROR on the image as on a tree, not "the bug is there".
    (image_project / "patches" / "probes" / "0002-flash-sm120.py").write_text(
        "import pathlib\npathlib.Path('vllm/no_such_file.py').read_text()\n")
    code, out = vpatch(image_project, "verify", content_tag, "--probes")
    assert code == 1, out
    assert "ERROR probe of 0002-flash-sm120: 0002-flash-sm120.yaml: error (FileNotFoundError: " in out, out
    assert "ERROR: the probe could not decide" in out and "FAIL probe" not in out, out


def test_a_base_that_is_not_the_pin_is_refused_before_any_layer(image_project: Path, bases: dict[str, str],
                                                                docker: Docker) -> None:
    wrong = docker.image(bases["0.28.0"]).id

    def children() -> set[str]:
        # A build's first step writes an image whose parent is the base.
        return {i["Id"] for i in docker.client.api.images(all=True) if i.get("ParentId") == wrong}

    before = children()
    code, out = vpatch(image_project, "build", "flash-next", "--base", bases["0.28.0"])
    assert code == 1, out
    assert f"base image {bases['0.28.0']} is not the pinned vLLM {PIN}: vllm/sampling_params.py differs" in out
    assert "hint: use the official image of v0.29.0 as the base" in out
    assert children() == before


def test_missing_base_and_failing_step_are_clear_errors(image_project: Path, docker: Docker, bases: dict[str, str],
                                                        tmp_path: Path) -> None:
    code, out = vpatch(image_project, "build", "flash-next", "--base", "vpatch-test/no-such-base:1")
    assert code == 1
    assert "image vpatch-test/no-such-base:1 is not on the docker daemon" in out
    assert "hint: pull it first" in out

    context = tmp_path / "failing"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {bases['0.29.0']}\nRUN echo preparing && echo broken-step >&2 && false\n")
    with pytest.raises(DockerError) as failed:
        docker.build(context, tag="vpatch-test/failing:1", buildargs={}, labels={})
    assert "returned a non-zero code: 1" in failed.value.message
    assert "preparing" in failed.value.message and "broken-step" in failed.value.message


def test_daemon_not_running_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    with pytest.raises(DockerError) as failed:
        Docker.connect()
    assert "docker daemon is not running" in failed.value.message
    assert failed.value.hint and "scripts/start-dockerd" in failed.value.hint


# --- push -------------------------------------------------------------------------------


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    """Debian's docker-registry on a free 127.0.0.1 port; yields host:port."""
    binary = shutil.which("docker-registry")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("docker-registry is not installed (scripts/start-dockerd installs it)")
        pytest.skip("docker-registry is not installed; scripts/start-dockerd installs it")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "registry.yml"
    config.write_text(f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {tmp_path / 'registry'}\n"
                      f"http:\n  addr: 127.0.0.1:{port}\n")
    proc = subprocess.Popen([binary, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_push_sends_both_tags_to_the_registry(image_project: Path, bases: dict[str, str], registry: str,
                                              docker: Docker) -> None:
    path = image_project / "images" / "flash-next.yaml"
    text = path.read_text()
    d = definition(image_project)
    assert d.registry, "images/flash-next.yaml names a registry"
    path.write_text(text.replace(d.registry, registry))
    code, out = vpatch(image_project, "build", "flash-next", "--base", bases["0.29.0"], "--push")
    assert code == 0, out
    assert out.count("pushed sha256:") == 2
    with urllib.request.urlopen(f"http://{registry}/v2/{d.repository}/tags/list") as resp:
        tags = set(json.load(resp)["tags"])
    content_tag = content_tag_of(out)
    assert tags == {content_tag.rsplit(":", 1)[1], d.tag}
    for tag in tags:
        docker.remove_image(f"{registry}/{d.repository}:{tag}")


# --- plans for vLLM's own Dockerfile, and BuildKit for real --------------------------------


def test_plan_for_a_csrc_patch_is_a_source_build_for_sm120(image_project: Path, release_history: Path) -> None:
    csrc = (image_project / "patches")
    raw = (csrc / "0001-top-k-guard.patch").read_bytes()
    # Same patch, but on a CUDA header: retarget the diff at csrc/cache.h's first line.
    header = vgit.read_blobs(release_history, PIN, ["csrc/cache.h"])["csrc/cache.h"]
    assert header is not None
    first = header.decode().splitlines()[0]
    (csrc / "0004-cache-header.patch").write_text(
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: Test Person <test@vpatch.invalid>\nDate: Tue, 1 Sep 2026 12:00:00 +0000\n"
        "Subject: Note the block size in cache.h\n\nWhy: kernels.\n\nOrigin: vendor\n---\n"
        "diff --git a/csrc/cache.h b/csrc/cache.h\n--- a/csrc/cache.h\n+++ b/csrc/cache.h\n"
        f"@@ -1 +1,2 @@\n {first}\n+// vpatch: block size 16 on sm_120\n"
    )
    assert raw  # the Python patches stay in the series
    code, out = vpatch(image_project, "build", "flash-next", "--plan")
    assert code == 0, out
    assert "strategy:  source" in out
    assert "csrc/cache.h" in out.split("reason:", 1)[1].splitlines()[0]
    command = command_of(out)
    assert "--build-arg torch_cuda_arch_list=12.0" in command
    assert "--build-arg RUN_WHEEL_CHECK=false" in command
    assert "--target vllm-openai" in command
    assert "docker/Dockerfile" in command
    d = definition(image_project)
    if d.source_build.max_jobs:
        assert f"--build-arg max_jobs={d.source_build.max_jobs}" in command
    assert f"-t {d.full_repository}:0.29.0-vp" in command
    assert f"-t {d.full_repository}:{d.tag}" in command

    # Overlay or precompiled cannot ship native code: asking for them is refused.
    code, out = vpatch(image_project, "build", "flash-next", "--plan", "--strategy", "overlay")
    assert code == 1 and "cannot ship native code" in out


def test_plan_for_precompiled_needs_vllms_own_commit(image_project: Path) -> None:
    # The release history's commits are vpatch's own: wheels.vllm.ai cannot know them.
    code, out = vpatch(image_project, "build", "flash-next", "--plan", "--strategy", "precompiled")
    assert code == 1
    assert "the precompiled wheel commit is unknown" in out and "source_build.wheel_commit" in out

    wheel_commit = "d" * 40
    path = image_project / "images" / "flash-next.yaml"
    path.write_text(path.read_text().replace("source_build:\n", f"source_build:\n  wheel_commit: {wheel_commit}\n"))
    code, out = vpatch(image_project, "build", "flash-next", "--plan", "--strategy", "precompiled")
    assert code == 0, out
    assert "strategy:  precompiled" in out
    command = command_of(out)
    assert "--build-arg VLLM_USE_PRECOMPILED=1" in command
    assert f"--build-arg VLLM_MERGE_BASE_COMMIT={wheel_commit}" in command
    assert "--build-arg RUN_WHEEL_CHECK=false" in command
    assert "torch_cuda_arch_list" not in command


def test_plan_for_python_only_series_is_overlay(image_project: Path, bases: dict[str, str]) -> None:
    code, out = vpatch(image_project, "build", "flash-next", "--plan", "--base", bases["0.29.0"])
    assert code == 0, out
    assert "strategy:  overlay" in out
    assert f"package:   {PACKAGE_DIR}" in out
    assert "  delete vllm/scripts.py" in out and "  add    vllm/vpatch_flash.py" in out
    assert "--build-arg VPATCH_DELETE=scripts.py" in out
    assert "????" not in out


def test_buildkit_runs_a_dockerfile_with_the_same_mechanism(docker: Docker, bases: dict[str, str],
                                                            tmp_path: Path) -> None:
    """vLLM's Dockerfile needs BuildKit (RUN --mount, targets, build args): run such a file for real."""
    context = tmp_path / "ctx"
    (context / "docker").mkdir(parents=True)
    (context / ".git").mkdir()
    (context / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (context / "docker" / "Dockerfile").write_text(
        f"FROM {bases['0.29.0']} AS base\nARG torch_cuda_arch_list='7.5 8.0'\nENV TORCH_CUDA_ARCH_LIST=${{torch_cuda_arch_list}}\n"
        "FROM base AS build\nARG RUN_WHEEL_CHECK=true\n"
        "RUN --mount=type=bind,source=.git,target=/src/.git cat /src/.git/HEAD > /head "
        "&& echo \"$TORCH_CUDA_ARCH_LIST $RUN_WHEEL_CHECK\" > /args\n"
        "FROM build AS vllm-openai\nRUN echo openai > /target\n"
        "FROM vllm-openai AS other\nRUN false\n"
    )
    tag = "vpatch-test/buildkit:1"
    invocation = buildkit_invocation(
        context=context, dockerfile=context / "docker" / "Dockerfile", tags=[tag],
        buildargs={"torch_cuda_arch_list": "12.0", "RUN_WHEEL_CHECK": "false"},
        labels={"io.vpatch.strategy": "source"}, target="vllm-openai",
    )
    lines: list[str] = []
    docker.run_buildkit(invocation, lines.append)
    try:
        assert lines
        files = docker.read_files(tag, ["/args", "/head", "/target"])
        assert files["/args"] == b"12.0 false\n"
        assert files["/head"] == b"ref: refs/heads/main\n"
        assert files["/target"] == b"openai\n"
        assert docker.image(tag).labels["io.vpatch.strategy"] == "source"
    finally:
        docker.remove_image(tag)

    # A failing stage: the error carries the command line and the failing step's output.
    failing = buildkit_invocation(context=context, dockerfile=context / "docker" / "Dockerfile", tags=[tag],
                                  buildargs={}, labels={}, target="other")
    (context / "docker" / "Dockerfile").write_text(
        (context / "docker" / "Dockerfile").read_text().replace("RUN false", "RUN echo kernel-build-broke && false"))
    with pytest.raises(DockerError) as failed:
        docker.run_buildkit(failing)
    assert "BuildKit build failed with exit code" in failed.value.message
    assert "--target other" in failed.value.message
    assert "kernel-build-broke" in failed.value.message


# --- image definitions -----------------------------------------------------------------


def test_the_shipped_definition_is_valid() -> None:
    d = ImageDefinition.load(REPO_ROOT, "flash-next")
    assert d.strategy is Strategy.AUTO
    assert d.source_build.torch_cuda_arch_list == "12.0"
    assert d.base_for(PIN, "0" * 40).image == f"vllm/vllm-openai:{PIN}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("image: {repository: ml/x, tag: t}\nstrategy: fast\n", "key 'strategy' must be one of auto, overlay"),
        ("image: {repository: ml/x}\n", "key 'image.tag' is missing"),
        ("image: {repository: ml/x, tag: t}\nbase: {digest: sha256:abc}\n", "key 'base.digest' must be sha256:<64 hex>"),
        ("image: {repository: ML/X, tag: t}\n", "key 'image.repository' is not a valid repository name"),
        ("image: {repository: ml/x, tag: t}\nsource_build: {max_jobs: 0}\n", "key 'source_build.max_jobs' must be a positive"),
        ("image: {repository: ml/x, tag: t}\nsource_build: {torch_cuda_arch_list: sm120}\n", "torch_cuda_arch_list' must be compute"),
        ("image: {repository: ml/x, tag: t}\nbuild: {}\n", "key 'build' is not a known key"),
    ],
)
def test_invalid_definitions_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "bad.yaml").write_text(text)
    with pytest.raises(ConfigError) as failed:
        ImageDefinition.load(tmp_path, "bad")
    assert message in failed.value.message
    assert "images/bad.yaml" in failed.value.message


def test_unknown_definition_lists_the_known_ones(tmp_path: Path) -> None:
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "flash-next.yaml").write_text("image: {repository: ml/x, tag: t}\n")
    with pytest.raises(VpatchError) as failed:
        ImageDefinition.load(tmp_path, "flash")
    assert failed.value.hint == "known images: flash-next"


def _sha(root: Path, number: str) -> str:
    import hashlib

    (path,) = (root / "patches").glob(f"{number}-*.patch")
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_source_build_runs_vllms_dockerfile_from_the_patched_tree(project, toy_upstream, docker: Docker,  # type: ignore[no-untyped-def]
                                                                  bases: dict[str, str]) -> None:
    """The source strategy end to end on a toy upstream whose docker/Dockerfile has vLLM's args and stages."""
    from conftest import write_config

    from vpatch.base.paths import cache_dir
    from vpatch.upstream import mirror

    toy_upstream.commit({
        "csrc/cache.h": "#pragma once\n#define BLOCK 16\n",
        "docker/Dockerfile": (
            f"FROM {bases['0.29.0']} AS base\n"
            "ARG torch_cuda_arch_list='7.5 8.0 8.6 8.9 9.0 10.0 11.0 12.0'\nARG max_jobs=2\nARG nvcc_threads=8\n"
            "ARG VLLM_USE_PRECOMPILED=\"\"\nARG VLLM_MERGE_BASE_COMMIT=\"\"\nARG RUN_WHEEL_CHECK=true\n"
            "WORKDIR /workspace\nCOPY . .\n"
            "RUN --mount=type=bind,source=.git,target=/workspace/.git test -d /workspace/.git/objects && "
            "echo \"$torch_cuda_arch_list $max_jobs $nvcc_threads $RUN_WHEEL_CHECK\" > /build-args\n"
            "FROM base AS vllm-openai\nRUN cp /workspace/csrc/cache.h /built-cache.h\n"
        ),
    }, "v1.1", tag="v1.1")
    write_config(project.root, toy_upstream.url, ref="v1.1")
    mirror.fetch(cache_dir(), toy_upstream.url)
    (project.root / "images").mkdir()
    (project.root / "images" / "toy.yaml").write_text(
        "image: {repository: vpatch-test/toy-source, tag: next}\n"
        "source_build: {torch_cuda_arch_list: '12.0', max_jobs: 3, nvcc_threads: 1}\n"
    )
    # Upstream is git here, so a precompiled plan can use the pin itself as the wheel commit.
    code, plan = vpatch(project.root, "build", "toy", "--plan", "--strategy", "precompiled")
    assert code == 0, plan
    pin = vgit.run(project.upstream.path, ["rev-parse", "v1.1"]).out.strip()
    assert f"--build-arg VLLM_MERGE_BASE_COMMIT={pin}" in command_of(plan)

    project.make_patch(1, "block-32", {"csrc/cache.h": "#pragma once\n#define BLOCK 32\n"}, "Blocks of 32", base="v1.1")
    code, out = vpatch(project.root, "build", "toy")
    assert code == 0, out
    assert "(source: the series changes native code (0001-block-32: csrc/cache.h)" in out
    tag = next(line.split()[0] for line in out.splitlines() if line.startswith("  vpatch-test/toy-source:"))
    try:
        files = docker.read_files(tag, ["/build-args", "/built-cache.h"])
        assert files["/build-args"] == b"12.0 3 1 false\n"
        assert files["/built-cache.h"] == b"#pragma once\n#define BLOCK 32\n"
        labels = docker.image(tag).labels
        assert labels["io.vpatch.strategy"] == "source"
        assert labels["io.vpatch.patches"] == "0001-block-32"
        assert "vpatch-test/toy-source:next" in docker.image(tag).tags
    finally:
        docker.remove_image(tag)
        docker.remove_image("vpatch-test/toy-source:next")


def test_shipped_series_builds_and_verifies_on_the_test_base(bases: dict[str, str], docker: Docker,
                                                             monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                             release_history: Path) -> None:
    """`vpatch build flash-next` for this repository's own vpatch.yaml and patches/, on the v0.29.0 test base."""
    from vpatch.config.project import Config
    from vpatch.series.files import Series

    if not (REPO_ROOT / "vpatch.yaml").is_file() or not list((REPO_ROOT / "patches").glob("*.patch")):
        pytest.skip("the shipped series (vpatch.yaml, patches/) is not in this checkout")
    monkeypatch.setenv("VPATCH_CACHE", str(REAL_CACHE))
    config = Config.load(REPO_ROOT)
    if config.pin.ref != PIN:
        pytest.skip(f"the shipped pin moved to {config.pin.ref}; the test base is {PIN}")
    series = Series.load(config.patches_dir)

    code, out = vpatch(REPO_ROOT, "build", "flash-next", "--base", bases["0.29.0"])
    assert code == 0, out
    assert "(overlay:" in out
    tag = content_tag_of(out)
    labels = docker.image(tag).labels
    assert labels["io.vpatch.patches"] == ",".join(p.name for p in series)

    # The image's files are what plain `git apply` of the series onto v0.29.0 gives.
    tree = tmp_path / "tree"
    vgit.add_worktree(release_history, tree, PIN)
    try:
        for p in series:
            vgit.run(tree, ["apply", "--index"], input=p.diff)
        touched = sorted({path for p in series for path in p.paths if path.startswith("vllm/")})
        in_image = docker.read_files(tag, [f"{PACKAGE_DIR}/{path.removeprefix('vllm/')}" for path in touched])
        for path in touched:
            want = (tree / path).read_bytes() if (tree / path).exists() else None
            assert in_image[f"{PACKAGE_DIR}/{path.removeprefix('vllm/')}"] == want, path
    finally:
        vgit.remove_worktree(release_history, tree)
    code, out = vpatch(REPO_ROOT, "verify", tag)
    assert code == 0, out
    # 0001's probe is declarative and runs on any image; the others need torch, which the test base lacks.
    code, out = vpatch(REPO_ROOT, "verify", tag, "--probes")
    assert "ok   probe of 0001-qsa-fp8-kv: 0001-qsa-fp8-kv.yaml: pass (all " in out, out


def test_a_folder_the_series_empties_is_gone_from_the_image(image_project: Path, bases: dict[str, str],
                                                            docker: Docker, release_history: Path,
                                                            tmp_path: Path) -> None:
    """Deleting every file of a subpackage must not leave an importable (namespace) package behind."""
    folder = "vllm/v1/kv_offload/tiering/example"
    tree = tmp_path / "tree"
    vgit.add_worktree(release_history, tree, PIN)
    try:
        vgit.run(tree, ["rm", "-r", "-q", folder])
        vgit.run(tree, ["commit", "-q", "-m", "Drop the tiering example\n\nNot shipped."])
        raw = vgit.run(tree, ["format-patch", "-1", "--stdout", "--zero-commit", "--full-index", "--no-signature",
                              "--no-stat", "-k", "--binary", "HEAD"]).stdout
    finally:
        vgit.remove_worktree(release_history, tree)
    (image_project / "patches" / "0004-drop-tiering-example.patch").write_bytes(raw)
    code, out = vpatch(image_project, "build", "flash-next", "--base", bases["0.29.0"])
    assert code == 0, out
    tag = content_tag_of(out)
    assert "example" not in docker.list_dir(tag, f"{PACKAGE_DIR}/v1/kv_offload/tiering")
    assert "tiering" in docker.list_dir(tag, f"{PACKAGE_DIR}/v1/kv_offload")
    code, out = vpatch(image_project, "verify", tag)
    assert code == 0, out


def test_verify_probe_outcomes_are_a_trees(docker: Docker, bases: dict[str, str], release_history: Path,
                                           tmp_path: Path) -> None:
    """One probe, the same files, two places: the test base image (v0.29.0's vllm/ installed) and the
    v0.29.0 tree. The same rules give the same outcome: a traceback with exit 1 and a missing file are
    ERROR in both, never "the bug is there"."""
    from vpatch.image.verify import image_place
    from vpatch.probes.file import Probe
    from vpatch.probes.outcome import ProbeOutcome, interpret
    from vpatch.probes.runner import run_probe

    (tmp_path / "crash.py").write_text("open('vllm/no_such_file.py')\n")  # FileNotFoundError: traceback, exit 1
    (tmp_path / "bug.py").write_text("import sys\nsys.exit(0 if 'VPATCH_NEVER' in open('vllm/__init__.py').read() else 1)\n")
    (tmp_path / "fixed.py").write_text("import sys\nsys.exit(0 if 'import' in open('vllm/__init__.py').read() else 1)\n")
    probes = {
        "crash": ("kind: command\nrun: ['{python}', '{probe_dir}/crash.py']\n", ProbeOutcome.ERROR),
        "bug": ("kind: command\nrun: ['{python}', '{probe_dir}/bug.py']\n", ProbeOutcome.FAIL),
        "fixed": ("kind: command\nrun: ['{python}', '{probe_dir}/fixed.py']\n", ProbeOutcome.PASS),
        "missing": ("kind: files\nfiles:\n  vllm/no_such_file.py:\n    not_contains: ['x']\n", ProbeOutcome.ERROR),
        "absent": ("kind: files\nfiles:\n  vllm/no_such_file.py:\n    absent_is_fix: true\n", ProbeOutcome.PASS),
        "lacks": ("kind: files\nfiles:\n  vllm/__init__.py:\n    contains: ['VPATCH_NEVER']\n", ProbeOutcome.FAIL),
        "holds": ("kind: files\nfiles:\n  vllm/__init__.py:\n    contains: ['import']\n", ProbeOutcome.PASS),
    }
    place = image_place(docker, docker.image(bases["0.29.0"]).id, PACKAGE_DIR)
    for name, (text, expected) in probes.items():
        (tmp_path / f"{name}.yaml").write_text(text)
        probe = Probe.load(tmp_path / f"{name}.yaml")
        on_tree = run_probe(release_history, probe, "v0.29.0", cache=REAL_CACHE, use_cache=False)
        on_image, detail = interpret(probe, place)
        assert (name, on_tree.outcome, on_image) == (name, expected, expected), (on_tree.detail, detail)
    assert "traceback" in interpret(Probe.load(tmp_path / "crash.yaml"), place)[1]
