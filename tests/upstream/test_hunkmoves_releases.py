"""Hunks that follow their code on the real vLLM release history, where git's file pairing cannot, and updates
that carry them (the relocation proven exact where the patch goes, a `files` probe following its strings):

(a) v0.33.0 cut vllm/renderers/chat_utils.py into the package vllm/renderers/chat_utils/ (seven modules, none of
    which git pairs with it at 50 %): a local change to validate_chat_template follows it to chat_template.py,
    is needed there, and `update --to v0.33.0` keeps it re-targeted (the relocation is exact); a `files` probe on
    the old path follows its strings there, and a string none of the patch's lines hold stops the update.
(b) v0.33.0 moved estimate_max_model_len out of vllm/v1/core/kv_cache_utils.py, which stays, into the new
    vllm/v1/core/kv_cache_planning.py: a local change to it follows the code there and is carried without a
    probe; where an earlier patch put a copy of that code there, the relocation is not exact and the update stops.
(c) v0.31.0 cut vllm/multimodal/cache.py into vllm/multimodal/cache/ (git pairs the old name with base.py): a
    change to ShmObjectStoreSenderCache and its `files` probe follow the code to shm.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import REAL_CACHE, git
from helpers.releasepatch import commit_project, diff_on, mail
from typer.testing import CliRunner

from vpatch import git as vgit
from vpatch.commands.cli import app
from vpatch.probes import ProbeOutcome, Witness
from vpatch.series.files import Patch

pytestmark = pytest.mark.releases
CHAT = "vllm/renderers/chat_utils.py"
TEMPLATE = "vllm/renderers/chat_utils/chat_template.py"
TEMPLATE_CHANGE = ('raise FileNotFoundError("the supplied chat template path doesn\'t exist")',
                   'raise FileNotFoundError(f"the supplied chat template path {chat_template} doesn\'t exist")')
KV = "vllm/v1/core/kv_cache_utils.py"
PLANNING = "vllm/v1/core/kv_cache_planning.py"
KV_CHANGE = ("left, right = 1, original_max_model_len", "left, right = 1, max(original_max_model_len, 1)")
MM = "vllm/multimodal/cache.py"
MM_BASE, MM_SHM = "vllm/multimodal/cache/base.py", "vllm/multimodal/cache/shm.py"
MM_CHANGE = ("if len(self._p0_cache) >= 2 * len(self._shm_cache.key_index):",
             "if len(self._p0_cache) > 2 * len(self._shm_cache.key_index):")
# behavioural, wherever the code lives: validate_chat_template names the missing path in its error
PROBE_PY = """import pathlib
import sys

wanted = 'f"the supplied chat template path {chat_template} doesn\\'t exist"'
sys.exit(0 if any(wanted in p.read_text() for p in pathlib.Path("vllm/renderers").rglob("*.py")) else 1)
"""


def vpatch(root: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["-C", str(root), *args])
    return result.exit_code, result.output


def cells(root: Path, *refs: str) -> dict[str, dict[str, dict[str, object]]]:
    args = [a for ref in refs for a in ("--against", ref)]
    result = CliRunner().invoke(app, ["-C", str(root), "status", *args, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    return {p["file"][:4]: p["results"] for p in data["patches"]}


def moved(cell: dict[str, object]) -> list[str]:
    evidence = cell["evidence"]
    assert isinstance(evidence, list)
    return [e["detail"] for e in evidence if e["kind"] == "moved"]


def chat_project(root: Path, history: Path, probes: dict[str, str]) -> Path:
    """Pinned at v0.32.0, one patch on validate_chat_template with the probe probes/template.yaml (`probes`: the
    files of patches/probes/)."""
    (root / "patches" / "probes").mkdir(parents=True)
    for name, text in probes.items():
        (root / "patches" / "probes" / name).write_text(text)
    (root / "patches" / "0001-template-path.patch").write_bytes(mail(
        "Name the missing chat template path", diff_on(history, root.parent, "v0.32.0", CHAT, TEMPLATE_CHANGE),
        "Probe: probes/template.yaml\n"))
    commit_project(root)
    return root


def files_probe(path: str, *more: str) -> str:
    """A `files` probe of the template change on `path` (JSON strings are YAML's double-quoted ones)."""
    contains = ", ".join(json.dumps(s) for s in (TEMPLATE_CHANGE[1], *more))
    return f"kind: files\nfiles:\n  {path}:\n    contains: [{contains}]\n    not_contains: [{json.dumps(TEMPLATE_CHANGE[0])}]\n"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release_history: Path) -> Path:
    monkeypatch.setenv("VPATCH_CACHE", str(REAL_CACHE))
    # the moves are real: git pairs neither old file with where the code went
    late = vgit.run(release_history, ["diff", "-M", "--name-status", "v0.32.0", "v0.33.0", "--"]).out.splitlines()
    assert f"D\t{CHAT}" in late and f"A\t{TEMPLATE}" in late and f"A\t{PLANNING}" in late and f"M\t{KV}" in late
    return chat_project(tmp_path / "project", release_history, {
        "template.yaml": 'kind: command\nrun: ["{python}", "{probe_dir}/template.py"]\ntimeout: 300\n',
        "template.py": PROBE_PY})


def test_a_hunk_follows_validate_chat_template_into_the_package_and_update_keeps_it_there(
        project: Path, release_history: Path) -> None:
    at33 = cells(project, "v0.33.0")["0001"]["v0.33.0"]
    assert at33["state"] == "needed" and at33["applies"] == "clean", at33
    file_move, hunk_move = moved(at33)
    assert file_move.startswith(f"{CHAT} was deleted in ") and "each of its hunks followed its code" in file_move
    assert hunk_move.startswith(f"{CHAT} hunk 1 (@@ -1460,7 +1460,7 @@) -> {TEMPLATE} line 24 (score 100%, the code "
                                "moved in "), hunk_move
    assert "(release v0.33.0)" in hunk_move
    assert f"{CHAT} #1 moved to {TEMPLATE}" in str(at33["summary"])

    code, out = vpatch(project, "update", "--to", "v0.33.0")
    assert code == 0, out
    assert f"moved: {CHAT} hunk 1 (@@ -1460,7 +1460,7 @@) -> {TEMPLATE}" in out
    # `git am -3` cannot place it; the relocation is exact (its probe is re-validated as every kept patch's is)
    assert (f"proof: `git am -3` of the old patch cannot place code that moved to another file; the relocation is "
            f"exact: {CHAT} hunk 1 -> {TEMPLATE} line 24, each hunk's whole pre-image (context and removed lines, "
            "byte for byte) at exactly one place there and replaced by its post-image, gives the re-targeted "
            "patch's tree ") in out, out
    assert "probe probes/template.yaml re-validated on v0.33.0" in out
    patch = Patch.load(project / "patches" / "0001-template-path.patch")
    assert patch.paths == (TEMPLATE,) and CHAT.encode() not in patch.diff
    assert TEMPLATE_CHANGE[1].encode() in patch.diff
    message = git(project, "log", "-1", "--format=%B")
    assert f"Re-targeted: upstream moved {CHAT} hunk 1" in message and "Probes re-validated on v0.33.0" in message

    after = cells(project)["0001"]["v0.33.0"]
    assert after["state"] == "needed" and after["applies"] == "clean" and not moved(after), after
    assert vpatch(project, "apply")[0] == 0
    assert TEMPLATE_CHANGE[1] in (project / ".vpatch" / "tree" / TEMPLATE).read_text()


def test_a_hunk_follows_code_moved_out_of_a_file_that_stays(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release_history: Path) -> None:
    monkeypatch.setenv("VPATCH_CACHE", str(REAL_CACHE))
    old, new = (vgit.read_blobs(release_history, "v0.33.0", [KV, PLANNING])[p] or b"" for p in (KV, PLANNING))
    assert b"def estimate_max_model_len(" not in old and KV_CHANGE[0].encode() in new
    root = tmp_path / "kv"
    (root / "patches").mkdir(parents=True)
    (root / "patches" / "0001-max-model-len.patch").write_bytes(mail(
        "Never search below length 1", diff_on(release_history, tmp_path, "v0.32.0", KV, KV_CHANGE)))
    commit_project(root)
    at33 = cells(root, "v0.33.0")["0001"]["v0.33.0"]
    assert at33["state"] == "needed" and at33["applies"] == "clean", at33
    (hunk_move,) = moved(at33)
    assert hunk_move.startswith(f"{KV} hunk 1 (@@ -1080,7 +1080,7 @@) -> {PLANNING} line 127 (score 100%"), hunk_move
    # apply onto the release puts it where the code is
    code, out = vpatch(root, "apply", "--ref", "v0.33.0")
    assert code == 0, out
    assert KV_CHANGE[1] in (root / ".vpatch" / "tree" / PLANNING).read_text()
    assert KV_CHANGE[1] not in (root / ".vpatch" / "tree" / KV).read_text()
    # no probe, and `git am -3` of the old patch cannot place it; the relocation is exact: carried
    proof = (f"`git am -3` of the old patch cannot place code that moved to another file; the relocation is exact: "
             f"{KV} hunk 1 -> {PLANNING} line 127, each hunk's whole pre-image (context and removed lines, byte for "
             "byte) at exactly one place there and replaced by its post-image, gives the re-targeted patch's tree ")
    # the dry run proves it as the real run does (on the patches applied in memory), and writes nothing
    code, out = vpatch(root, "update", "--to", "v0.33.0", "--dry-run")
    assert code == 0, out
    assert "would re-apply 0001-max-model-len.patch" in out and f"proof: {proof}" in out, out
    assert git(root, "status", "--porcelain", "--", "patches", "vpatch.yaml") == "" and not (root / ".git" / "vpatch-update").exists()
    assert "pin:\n  ref: v0.32.0" in (root / "vpatch.yaml").read_text()
    code, out = vpatch(root, "update", "--to", "v0.33.0")
    assert code == 0, out
    assert f"proof: {proof}" in out, out
    patch = Patch.load(root / "patches" / "0001-max-model-len.patch")
    assert patch.paths == (PLANNING,) and KV_CHANGE[1].encode() in patch.diff
    message = git(root, "log", "-1", "--format=%B")
    assert f"Re-targeted: upstream moved {KV} hunk 1 (@@ -1080,7 +1080,7 @@) -> {PLANNING}" in message
    assert f"Proof: {proof}" in message, message
    assert "pin:\n  ref: v0.33.0" in (root / "vpatch.yaml").read_text()
    code, out = vpatch(root, "apply")
    assert code == 0, out
    assert KV_CHANGE[1] in (root / ".vpatch" / "tree" / PLANNING).read_text()
    after = cells(root)["0001"]["v0.33.0"]
    assert after["state"] == "needed" and after["applies"] == "clean" and not moved(after), after


def test_a_files_probe_on_the_split_file_follows_its_strings_into_the_package(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release_history: Path) -> None:
    monkeypatch.setenv("VPATCH_CACHE", str(REAL_CACHE))
    root = chat_project(tmp_path / "files", release_history, {"template.yaml": files_probe(CHAT)})
    # the probe names the file the pin has; on v0.33.0 that file is gone with no successor git pairs
    followed = f"probe check probes/template.yaml: {CHAT} -> {TEMPLATE}, its strings followed hunk 1"
    code, out = vpatch(root, "update", "--to", "v0.33.0", "--dry-run")  # follows and validates it as the run does
    assert code == 0, out
    assert followed in out and "the relocation is exact" in out, out
    assert ("probe probes/template.yaml re-validated on v0.33.0: template.yaml fails without the patch and passes "
            "with it") in out, out
    assert (root / "patches" / "probes" / "template.yaml").read_text() == files_probe(CHAT)
    assert git(root, "status", "--porcelain", "--", "patches", "vpatch.yaml") == "" and not (root / ".git" / "vpatch-update").exists()
    code, out = vpatch(root, "update", "--to", "v0.33.0")
    assert code == 0, out
    assert followed in out, out
    assert ("probe probes/template.yaml re-validated on v0.33.0: template.yaml fails without the patch and passes "
            "with it") in out, out
    # its key renamed, nothing else of it touched
    assert (root / "patches" / "probes" / "template.yaml").read_text() == files_probe(TEMPLATE)
    message = git(root, "log", "-1", "--format=%B")
    assert f"Probe followed: probe check probes/template.yaml: {CHAT} -> {TEMPLATE}" in message, message
    assert "Files probes re-targeted to the moved paths (their keys rewritten):\n- patches/probes/template.yaml" in message
    after = cells(root)["0001"]["v0.33.0"]
    assert after["state"] == "needed" and after["decided_by"] == "probe", after


def squeezed(text: str) -> str:
    """`text` without blanks and the table's column rules, as a cell wrapped across lines reads."""
    return re.sub(r"[\s│]", "", text)


def probe_cell(cell: dict[str, object]) -> str:
    evidence = cell["evidence"]
    assert isinstance(evidence, list)
    (probe,) = [e["detail"] for e in evidence if e["kind"] == "probe"]
    return str(probe)


def test_status_runs_a_files_probe_on_the_split_file_where_its_strings_went(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release_history: Path) -> None:
    """Before any update: status follows the probe's strings with the code to chat_template.py, where it fails
    without the patch (needed, decided by the probe) and passes with the re-targeted patch; not an error."""
    monkeypatch.setenv("VPATCH_CACHE", str(REAL_CACHE))
    root = chat_project(tmp_path / "files", release_history, {"template.yaml": files_probe(CHAT)})
    at33 = cells(root, "v0.33.0")["0001"]["v0.33.0"]
    followed = f"probe followed {CHAT} -> {TEMPLATE}, its strings followed hunk 1"
    assert at33["state"] == "needed" and at33["decided_by"] == "probe", at33
    said = probe_cell(at33)
    assert said.startswith("probes/template.yaml fails on the unpatched tree (") and said.endswith(f"; {followed}"), said
    assert f"{TEMPLATE}: still has " in said and CHAT + ":" not in said, said
    assert followed in str(at33["summary"]), at33["summary"]
    code, out = vpatch(root, "status", "--against", "v0.33.0", "--exit-code")
    assert code == 0, out
    assert squeezed(followed) in squeezed(out), out  # the table's cell says it too (wrapped in its column)
    # the other side: the same followed probe passes on v0.33.0 with the patch where apply puts it
    code, out = vpatch(root, "apply", "--ref", "v0.33.0")
    assert code == 0, out
    assert TEMPLATE_CHANGE[1] in (root / ".vpatch" / "tree" / TEMPLATE).read_text()
    patched = vgit.tree_of(root / ".vpatch" / "tree", "HEAD")
    patch = Patch.load(root / "patches" / "0001-template-path.patch")
    check = Witness(release_history).answer(patch, patched, {(CHAT, 1): TEMPLATE})
    assert check is not None and check.outcome is ProbeOutcome.PASS, check
    assert check.followed == (f"{CHAT} -> {TEMPLATE}, its strings followed hunk 1",)
    unpatched = Witness(release_history).answer(patch, vgit.resolve_commit(release_history, "v0.33.0") or "",
                                                {(CHAT, 1): TEMPLATE})
    assert unpatched is not None and unpatched.outcome is ProbeOutcome.FAIL, unpatched


def test_status_says_plainly_a_files_probe_string_no_hunk_holds_is_not_followed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release_history: Path) -> None:
    monkeypatch.setenv("VPATCH_CACHE", str(REAL_CACHE))
    root = chat_project(tmp_path / "files", release_history,
                        {"template.yaml": files_probe(CHAT, "def validate_chat_template(")})
    at33 = cells(root, "v0.33.0")["0001"]["v0.33.0"]
    # the text decides (the probe counts neither way), and the cell says why the probe did not
    assert at33["state"] == "needed" and at33["decided_by"] == "forward-apply", at33
    said = " ".join(probe_cell(at33).split())
    assert said.startswith("probes/template.yaml was not followed where its patch's code went (counted neither "
                           "way): 0001-template-path.patch: probe probes/template.yaml: the string "
                           f"'def validate_chat_template(' of its check on {CHAT} is in none of the patch's hunks "
                           f"there (the result), and upstream moved that file's code ({CHAT} hunk 1 -> {TEMPLATE}): "
                           "where the string is checked now is not guessed; in probes/template.yaml, move that "
                           f"string to the file that holds its code now ({TEMPLATE}) or take it out"), said
    assert "probe not followed: " in str(at33["summary"]), at33["summary"]
    # a person must fix the probe: attention, not a verdict guessed
    code, out = vpatch(root, "status", "--against", "v0.33.0", "--exit-code")
    assert code == 4, out
    assert squeezed("probe not followed: a string of its check is in none of the patch's hunks") in squeezed(out), out


def test_a_files_probe_string_no_hunk_holds_is_not_guessed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release_history: Path) -> None:
    monkeypatch.setenv("VPATCH_CACHE", str(REAL_CACHE))
    # a string of the file that none of the patch's lines hold: where it is checked after the split is unknown
    root = chat_project(tmp_path / "files", release_history,
                        {"template.yaml": files_probe(CHAT, "def validate_chat_template(")})
    for said in refusals(root):
        assert (f"0001-template-path.patch: probe probes/template.yaml: the string 'def validate_chat_template(' of "
                f"its check on {CHAT} is in none of the patch's hunks there (the result), and upstream moved that "
                f"file's code ({CHAT} hunk 1 -> {TEMPLATE}): where the string is checked now is not guessed; the "
                "project is unchanged") in said, said
        assert f"move that string to the file that holds its code now ({TEMPLATE})" in said, said
    assert git(root, "status", "--porcelain", "--", "patches", "vpatch.yaml") == ""
    assert len(git(root, "log", "--format=%H").split()) == 1


def refusals(root: Path) -> list[str]:
    """`update --to v0.33.0` refused, the dry run first, then the real run: each one's output with its whitespace
    folded (a wrapped line reads as one). The dry run refuses as the real run does (its plan says "would refuse",
    never "would re-apply", for the patch); neither leaves the update's folder behind."""
    said = []
    for dry in (("--dry-run",), ()):
        code, out = vpatch(root, "update", "--to", "v0.33.0", *dry)
        assert code != 0, out
        # the refused patch is never "would re-apply": the dry run prints it as refused, then the error
        assert not dry or re.search(r"would refuse\s+\S+\.patch", out), out
        assert not (root / ".git" / "vpatch-update").exists()
        said.append(" ".join(out.split()))
    return said


def kv_project(root: Path, history: Path, patches: dict[str, bytes]) -> Path:
    (root / "patches").mkdir(parents=True)
    for name, data in patches.items():
        (root / "patches" / name).write_bytes(data)
    commit_project(root)
    return root


def test_a_relocation_whose_code_is_at_two_places_where_it_goes_stops_the_update(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release_history: Path) -> None:
    """The search ran on v0.33.0, where the code the change needs is at one place of kv_cache_planning.py. The
    update applies the series in order, and 0001 (a vendor's copy of estimate_max_model_len, carried into
    kv_cache_planning.py too: its own relocation is exact) puts that code at a second place: which one the change
    belongs at is not taken on trust, and without a probe the update stops."""
    monkeypatch.setenv("VPATCH_CACHE", str(REAL_CACHE))
    text = (vgit.read_blobs(release_history, "v0.32.0", [KV])[KV] or b"").decode()
    body = text[text.index("def estimate_max_model_len("):text.index("def check_enough_kv_cache_memory(")]
    copy = body.replace("def estimate_max_model_len(", "def estimate_max_model_len_per_group(", 1)
    root = kv_project(tmp_path / "kv", release_history, {
        "0001-per-group.patch": mail("Estimate per KV cache group", diff_on(
            release_history, tmp_path / "one", "v0.32.0", KV,
            ("def check_enough_kv_cache_memory(", copy + "def check_enough_kv_cache_memory("))),
        "0002-max-model-len.patch": mail("Never search below length 1", diff_on(
            release_history, tmp_path / "two", "v0.32.0", KV, KV_CHANGE))})
    at33 = cells(root, "v0.33.0")
    assert [at33[n]["v0.33.0"]["state"] for n in ("0001", "0002")] == ["needed", "needed"], at33
    for said in refusals(root):
        assert (f"0002-max-model-len.patch was re-targeted where upstream moved its code (hunks to another file), "
                f"but `git am -3` of the old patch cannot apply there, the relocation is not exact ({KV} hunk 1 -> "
                f"{PLANNING}: its whole pre-image (context and removed lines) is at 2 places of it (lines 127, ") \
            in said, said
        assert "and the patch has no probe to prove the result; the project is unchanged" in said
    assert git(root, "status", "--porcelain", "--", "patches", "vpatch.yaml") == ""
    assert len(git(root, "log", "--format=%H").split()) == 1


def test_v0_31_0_cut_multimodal_cache_into_a_package_a_files_probe_on_it_follows_the_code_not_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release_history: Path) -> None:
    """v0.31.0 cut vllm/multimodal/cache.py into vllm/multimodal/cache/: git pairs the old name with base.py (52 %),
    while ShmObjectStoreSenderCache went to shm.py. A change there and a `files` probe on the old path follow the
    code to shm.py (the file move alone would have sent the probe to base.py, which holds none of it)."""
    monkeypatch.setenv("VPATCH_CACHE", str(REAL_CACHE))
    late = vgit.run(release_history, ["diff", "-M", "--name-status", "v0.30.0", "v0.31.0", "--"]).out.splitlines()
    assert any(line.startswith("R") and line.endswith(f"\t{MM}\t{MM_BASE}") for line in late), late
    root = tmp_path / "mm"
    (root / "patches" / "probes").mkdir(parents=True)
    (root / "patches" / "probes" / "p0.yaml").write_text(
        f"kind: files\nfiles:\n  {MM}:\n    contains: [{json.dumps(MM_CHANGE[1])}]\n"
        f"    not_contains: [{json.dumps(MM_CHANGE[0])}]\n")
    (root / "patches" / "0001-p0-cache.patch").write_bytes(mail(
        "Clean the p0 cache only past twice the shm cache", diff_on(release_history, tmp_path, "v0.30.0", MM, MM_CHANGE),
        "Probe: probes/p0.yaml\n"))
    (root / "vpatch.yaml").write_text("upstream:\n  source: releases\n  releases: vllm\npin:\n  ref: v0.30.0\n"
                                      "patches: patches\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "project")
    code, out = vpatch(root, "update", "--to", "v0.31.0")
    assert code == 0, out
    assert f"moved: {MM} hunk 1 (@@ " in out and f") -> {MM_SHM} line " in out, out
    assert f"the relocation is exact: {MM} hunk 1 -> {MM_SHM} line 109, " in out, out
    assert f"probe check probes/p0.yaml: {MM} -> {MM_SHM}, its strings followed hunk 1" in out, out
    assert "probe probes/p0.yaml re-validated on v0.31.0: p0.yaml fails without the patch and passes with it" in out
    patch = Patch.load(root / "patches" / "0001-p0-cache.patch")
    assert patch.paths == (MM_SHM,) and MM_CHANGE[1].encode() in patch.diff
    assert f"  {MM_SHM}:\n" in (root / "patches" / "probes" / "p0.yaml").read_text()
    after = cells(root)["0001"]["v0.31.0"]
    assert after["state"] == "needed" and after["applies"] == "clean" and after["decided_by"] == "probe", after
