"""Strategy choice, net file changes, build args and content tags: no daemon needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from vpatch import git as vgit
from vpatch.base.errors import VpatchError
from vpatch.config.definition import ImageDefinition, Strategy
from vpatch.image.plan import ChangeKind, Changes, choose, classify, content_hash, declared_args, vllm_buildargs
from vpatch.series.files import Patch

DEFINITION = ImageDefinition(name="flash-next", path=Path("images/flash-next.yaml"), repository="ml/x", tag="next")


def patch(number: int, *files: tuple[str | None, str | None]) -> Patch:
    """A format-patch with one empty-bodied diff per (old, new) path pair (None: created / deleted)."""
    blocks = []
    for old, new in files:
        a, b = old or new, new or old
        head = f"diff --git a/{a} b/{b}\n"
        if old is None:
            blocks.append(head + f"new file mode 100644\n--- /dev/null\n+++ b/{b}\n@@ -0,0 +1 @@\n+x\n")
        elif new is None:
            blocks.append(head + f"deleted file mode 100644\n--- a/{a}\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n")
        elif old != new:
            blocks.append(f"diff --git a/{old} b/{new}\nsimilarity index 90%\nrename from {old}\nrename to {new}\n"
                          f"--- a/{old}\n+++ b/{new}\n@@ -1 +1 @@\n-x\n+y\n")
        else:
            blocks.append(head + f"--- a/{a}\n+++ b/{b}\n@@ -1 +1 @@\n-x\n+y\n")
    raw = (f"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\nFrom: T <t@vpatch.invalid>\n"
           f"Date: Tue, 1 Sep 2026 12:00:00 +0000\nSubject: change {number}\n\nWhy.\n---\n" + "".join(blocks))
    return Patch.parse(raw.encode(), number=number, slug=f"change-{number}", path=Path(f"patches/{number:04d}-change-{number}.patch"))


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("vllm/v1/core/single_type_kv_cache_manager.py", ChangeKind.PACKAGE),
        ("vllm/entrypoints/openai/tool_parsers/template.jinja", ChangeKind.PACKAGE),
        ("csrc/cache_kernels.cu", ChangeKind.NATIVE),
        ("CMakeLists.txt", ChangeKind.NATIVE),
        ("cmake/utils.cmake", ChangeKind.NATIVE),
        ("vllm/_C.abi3.so", ChangeKind.NATIVE),
        ("setup.py", ChangeKind.NATIVE),
        ("requirements/common.txt", ChangeKind.BUILD),
        ("docker/Dockerfile", ChangeKind.BUILD),
        ("pyproject.toml", ChangeKind.BUILD),
        ("tests/v1/core/test_kv.py", ChangeKind.UNSHIPPED),
        ("docs/usage.md", ChangeKind.UNSHIPPED),
    ],
)
def test_classify(path: str, kind: ChangeKind) -> None:
    assert classify(path) is kind


def test_auto_chooses_by_what_the_series_touches() -> None:
    python = patch(1, ("vllm/sampling_params.py", "vllm/sampling_params.py"), ("tests/test_s.py", "tests/test_s.py"))
    native = patch(2, ("csrc/cache.h", "csrc/cache.h"))
    deps = patch(3, ("requirements/common.txt", "requirements/common.txt"))

    strategy, reason = choose(DEFINITION, [python], override=None, base_available=True)
    assert strategy is Strategy.OVERLAY and "only files of the vllm/ package" in reason
    strategy, reason = choose(DEFINITION, [python], override=None, base_available=False)
    assert strategy is Strategy.PRECOMPILED and "no official image for the pin" in reason
    strategy, reason = choose(DEFINITION, [python, deps], override=None, base_available=True)
    assert strategy is Strategy.PRECOMPILED and "0003-change-3: requirements/common.txt" in reason
    strategy, reason = choose(DEFINITION, [python, native, deps], override=None, base_available=True)
    assert strategy is Strategy.SOURCE and "0002-change-2: csrc/cache.h" in reason

    assert choose(DEFINITION, [python], override=Strategy.SOURCE, base_available=True) == (
        Strategy.SOURCE, "requested by --strategy")
    with pytest.raises(VpatchError, match="strategy overlay copies package files only"):
        choose(DEFINITION, [deps], override=Strategy.OVERLAY, base_available=True)
    with pytest.raises(VpatchError, match="strategy precompiled cannot ship native code"):
        choose(DEFINITION, [native], override=Strategy.PRECOMPILED, base_available=True)


def test_changes_follow_adds_deletes_and_renames_through_the_series() -> None:
    series = [
        patch(1, ("vllm/a.py", "vllm/a.py"), (None, "vllm/new.py"), ("vllm/old.py", None)),
        patch(2, ("vllm/new.py", None), ("vllm/b.py", "vllm/c.py")),  # added then deleted: no net change
        patch(3, (None, "vllm/old.py")),  # deleted then re-added: written
    ]
    changes = Changes.of(series)
    assert changes.written == ("vllm/a.py", "vllm/c.py", "vllm/old.py")
    assert changes.deleted == ("vllm/b.py",)
    assert changes.added == ("vllm/c.py",)
    assert Changes.of([patch(1, ("tests/t.py", "tests/t.py"), ("vllm/a.py", "vllm/a.py"))]).within("vllm").paths == ("vllm/a.py",)


def test_buildargs_follow_the_args_the_pins_dockerfile_declares(release_history: Path) -> None:
    text = vgit.read_blobs(release_history, "v0.29.0", ["docker/Dockerfile"])["docker/Dockerfile"]
    assert text is not None
    declared = declared_args(text.decode())
    assert {"VLLM_USE_PRECOMPILED", "VLLM_MERGE_BASE_COMMIT", "torch_cuda_arch_list", "max_jobs", "nvcc_threads",
            "RUN_WHEEL_CHECK"} <= declared

    args, notes = vllm_buildargs(DEFINITION, Strategy.PRECOMPILED, wheel_commit="c" * 40, declared=declared)
    assert args == {"VLLM_USE_PRECOMPILED": "1", "VLLM_MERGE_BASE_COMMIT": "c" * 40, "RUN_WHEEL_CHECK": "false"}
    args, notes = vllm_buildargs(DEFINITION, Strategy.SOURCE, wheel_commit="c" * 40, declared=declared)
    assert args == {"torch_cuda_arch_list": "12.0", "RUN_WHEEL_CHECK": "false"}

    # An older Dockerfile that knew only the other name of the wheel-commit arg, and no wheel check.
    old = declared_args("ARG VLLM_USE_PRECOMPILED\nARG VLLM_PRECOMPILED_WHEEL_COMMIT=\nARG torch_cuda_arch_list='8.0'\n")
    args, notes = vllm_buildargs(DEFINITION, Strategy.PRECOMPILED, wheel_commit="c" * 40, declared=old)
    assert args == {"VLLM_USE_PRECOMPILED": "1", "VLLM_PRECOMPILED_WHEEL_COMMIT": "c" * 40}
    assert notes == ["docker/Dockerfile at the pin declares no RUN_WHEEL_CHECK; not passed"]
    with pytest.raises(VpatchError, match="the precompiled wheel commit is unknown") as unknown:
        vllm_buildargs(DEFINITION, Strategy.PRECOMPILED, wheel_commit=None, declared=declared)
    assert unknown.value.hint and "source_build.wheel_commit" in unknown.value.hint
    with pytest.raises(VpatchError, match="declares none of VLLM_USE_PRECOMPILED"):
        vllm_buildargs(DEFINITION, Strategy.PRECOMPILED, wheel_commit="c" * 40, declared={"torch_cuda_arch_list"})
    with pytest.raises(VpatchError, match="declares no torch_cuda_arch_list"):
        vllm_buildargs(DEFINITION, Strategy.SOURCE, wheel_commit="c" * 40, declared={"max_jobs"})


def test_content_hash_changes_with_each_input_and_only_then() -> None:
    one, two = patch(1, ("vllm/a.py", "vllm/a.py")), patch(2, ("vllm/b.py", "vllm/b.py"))
    args = {"strategy": Strategy.OVERLAY, "base_identity": "sha256:" + "1" * 64, "pin_commit": "a" * 40,
            "patches": [one, two], "recipe": {"dockerfile": "d"}}
    same = content_hash(**args)  # type: ignore[arg-type]
    assert same == content_hash(**args) and len(same) == 12  # type: ignore[arg-type]
    for key, value in (("base_identity", "sha256:" + "2" * 64), ("pin_commit", "b" * 40), ("patches", [one]),
                       ("recipe", {"dockerfile": "e"}), ("strategy", Strategy.SOURCE)):
        assert content_hash(**(args | {key: value})) != same, key  # type: ignore[arg-type]
