"""A stop has one truth, on the real vLLM release history: a needed patch on v0.33.0 whose line upstream rewrote
in v0.34.0 stops `update --to v0.34.0`; the person resolves in the update tree and `git add`s, names the vendor
bug in the patch's header in patches/ and commits that (the stop's hint offers both). One `--continue` ends at
v0.34.0 with one resolution: the tree's diff under the file's header, asked for once. A hand edit that changes
the diff as well, to something else than the tree holds, stops naming both and discards neither.
tests/update/test_stopped_update.py covers each rule on toy upstreams."""

from __future__ import annotations

import difflib
import hashlib
import time
from pathlib import Path

import pytest
from conftest import REAL_CACHE, git
from helpers.shipped import committed_copy, vpatch

from vpatch import git as vgit
from vpatch.config.project import Config

pytestmark = pytest.mark.releases

PATCH = "0001-lora-duplicate-layer-name.patch"
PATH = "vllm/lora/layers/base_linear.py"
# v0.33.0's line, which v0.34.0 rewrites as an f-string (upstream's own change, in the release history)
LINE = '            raise ValueError("Duplicate layer name: {}".format(self.layer_name))\n'
UPSTREAM = '            raise ValueError(f"Duplicate layer name: {self.layer_name}")\n'
SAYS = "two LoRA layers share the base layer's prefix"  # what the patch adds, and what its probe looks for
FIXED = f'            raise ValueError("Duplicate layer name: {{}} ({SAYS})".format(self.layer_name))\n'
RESOLVED = f'            raise ValueError(f"Duplicate layer name: {{self.layer_name}} ({SAYS})")\n'
BUG = "Vendor-Bug: INFRA-4711 (a duplicate LoRA layer name does not say why)"
PROBE = f"# the text the patch adds\nkind: files\nfiles:\n  {PATH}:\n    contains: [{SAYS!r}]\n"


def series_on_v0_33_0(history: Path) -> dict[str, bytes]:
    """One patch on v0.33.0 that says why a LoRA layer name is a duplicate, with a files probe."""
    before = (vgit.read_blobs(history, "v0.33.0", [PATH])[PATH] or b"").decode()
    assert before.count(LINE) == 1, "v0.33.0 no longer holds the line this test patches"
    after = before.replace(LINE, FIXED)
    # the index line as git format-patch writes it: a 3-way apply finds the preimage blob in the history
    diff = f"diff --git a/{PATH} b/{PATH}\nindex {blob_id(before)}..{blob_id(after)} 100644\n" + "".join(difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{PATH}", f"b/{PATH}", n=3))
    mail = ("From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\nFrom: Test Person "
            "<test@vpatch.invalid>\nDate: Tue, 1 Dec 2026 12:00:00 +0000\nSubject: lora: say why a layer name is "
            "a duplicate\n\nThe error names the layer only; operators could not tell which layers collided.\n\n"
            f"Origin: vendor\nProbe: probes/{PATCH.removesuffix('.patch')}.yaml\nLast-Update: 2026-12-01\n\n")
    return {"vpatch.yaml": b"upstream:\n  source: releases\n  releases: vllm\npin:\n  ref: v0.33.0\npatches: patches\n",
            f"patches/{PATCH}": (mail + diff).encode(),
            f"patches/probes/{PATCH.removesuffix('.patch')}.yaml": PROBE.encode()}


def blob_id(text: str) -> str:
    data = text.encode()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@pytest.fixture
def stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release_history: Path) -> Path:
    """The project, its `update --to v0.34.0` stopped at the patch: upstream rewrote its line."""
    monkeypatch.setenv("VPATCH_CACHE", str(REAL_CACHE))
    after = (vgit.read_blobs(release_history, "v0.34.0", [PATH])[PATH] or b"").decode()
    assert UPSTREAM in after and LINE not in after, "v0.34.0 no longer rewrites the line this test patches"
    root = committed_copy(tmp_path / "project", series_on_v0_33_0(release_history))
    code, out = vpatch(root, "update", "--to", "v0.34.0")
    assert code == 5, out
    assert f"stopped at {PATCH}" in out and f"conflicts in: {PATH}" in out, out
    return root


def resolve_in_tree(root: Path) -> Path:
    """What a person does first: upstream's f-string with the patch's words, then `git add`."""
    tree = root / ".git" / "vpatch-update" / "tree"
    file = tree / PATH
    text = file.read_text()
    start, end = text.index("<<<<<<< "), text.index(">>>>>>> ")
    file.write_text(text[:start] + RESOLVED + text[text.index("\n", end) + 1:])
    git(tree, "add", PATH)
    return tree


def name_the_bug(root: Path) -> str:
    patch = root / "patches" / PATCH
    text = patch.read_text()
    edited = text.replace("\nOrigin: vendor", f"\n{BUG}\n\nOrigin: vendor", 1)
    patch.write_text(edited)
    return edited


def test_the_trees_resolution_and_a_header_edit_of_patches_make_one_resolution(stopped: Path) -> None:
    started = time.monotonic()
    resolve_in_tree(stopped)
    name_the_bug(stopped)
    git(stopped, "commit", "-q", "-am", "0001: name the vendor bug")
    mine = git(stopped, "rev-parse", "HEAD").strip()

    code, out = vpatch(stopped, "update", "--continue")
    # one --continue: the resolution made in the tree is not asked for again
    assert code == 0, out
    assert f"took in the header of patches/{PATCH} as edited by hand; its diff comes from the update tree" in out
    assert "set aside" not in out and not (stopped / ".git" / "vpatch-resolutions").exists(), out
    assert Config.load(stopped).pin.ref == "v0.34.0"
    assert git(stopped, "rev-parse", "HEAD~1").strip() == mine  # the update's commit on top of the person's
    text = (stopped / "patches" / PATCH).read_text()
    # the diff from the tree: upstream's f-string carrying the patch's words; the header from the file
    assert f"+{RESOLVED}" in text and f"-{UPSTREAM}" in text and ".format(" not in text, text
    assert BUG in text and "Rewritten: by hand for v0.34.0" in text
    message = git(stopped, "log", "-1", "--format=%B")
    assert f"Evidence: probe probes/{PATCH.removesuffix('.patch')}.yaml re-validated on v0.34.0: fails without it, " \
           "passes with it" in message, message
    # the project's series applies on the new pin as committed
    assert vpatch(stopped, "apply")[0] == 0
    print(f"stop, resolve in the tree, header edit, one --continue to v0.34.0: {time.monotonic() - started:.1f}s")


def test_a_hand_edited_diff_and_a_different_tree_resolution_stop_naming_both(stopped: Path) -> None:
    tree = resolve_in_tree(stopped)
    patch = stopped / "patches" / PATCH
    # the file's own rewrite for v0.34.0: the same words, said another way than in the tree
    edited = name_the_bug(stopped).replace(f"+{FIXED}", f"+{RESOLVED.replace(SAYS, SAYS + ' (check the adapters)')}")
    edited = edited.replace(f"-{LINE}", f"-{UPSTREAM}")
    patch.write_text(edited)
    git(stopped, "commit", "-q", "-am", "0001 rewritten for v0.34.0 in patches/")
    code, out = vpatch(stopped, "update", "--continue")
    assert code == 5, out
    flat = " ".join(out.split())
    assert (f"{PATCH} has two different resolutions: patches/{PATCH} as edited by hand (committed during the stop) "
            f"and the update tree's ({PATH}); nothing was discarded") in flat, out
    assert "hint: keep one" in out
    # neither is discarded: the tree holds its resolution, staged; the file holds its edit
    assert (tree / PATH).read_text().count(RESOLVED) == 1
    assert git(tree, "diff", "--name-only", "--diff-filter=U") == "" and PATH in git(tree, "diff", "--cached", "--name-only")
    assert patch.read_text() == edited
    assert not (stopped / ".git" / "vpatch-resolutions").exists()
    assert Config.load(stopped).pin.ref == "v0.33.0"

    # the person keeps the tree's, as the hint says: the diff back as the update found it, the header edit stays
    found = git(stopped, "show", f"HEAD~1:patches/{PATCH}")
    patch.write_text(edited[:edited.index("\ndiff --git ") + 1] + found[found.index("\ndiff --git ") + 1:])
    git(stopped, "commit", "-q", "-am", "0001: the tree's resolution")
    code, out = vpatch(stopped, "update", "--continue")
    assert code == 0, out
    text = patch.read_text()
    assert f"+{RESOLVED}" in text and "check the adapters" not in text and BUG in text
    assert Config.load(stopped).pin.ref == "v0.34.0"
