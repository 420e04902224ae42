"""One patch's probe checked the way `update` checks it: on the pin (it must fail) and on the pin plus the
series up to and including the patch (it must pass); and the template `vpatch probe new` writes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vpatch.base import atomic_write
from vpatch.probes.env import LOCK_NAME
from vpatch.probes.file import ProbeError, probe_for
from vpatch.probes.outcome import ProbeKind
from vpatch.probes.runner import Validation
from vpatch.probes.templates import COMMAND_PROBE, NAME
from vpatch.probes.witness import Witness, stacked_tree
from vpatch.series import PROBE, Patch, Series
from vpatch.tree import tree_patch, tree_work


@dataclass(frozen=True)
class Checked:
    patch: str  # the patch file
    probe: str  # the probe's file name
    ref: str  # what the base is called (the pin's ref, or --ref)
    base: str  # the base commit
    validation: Validation


def find_patch(series: Series, state_dir: Path, key: str) -> tuple[str, Patch | None, list[Patch]]:
    """The patch `key` names (its number or name): from the series, else the commit `vpatch new` started in the
    applied tree. Its name, the patch (None while that commit changes nothing), and the series with it in place."""

    patches = list(series.patches)
    found = next((p for p in patches if key in (p.name, p.filename) or (key.isdigit() and int(key) == p.number)), None)
    if found is not None:
        return found.name, found, patches
    name, found = tree_patch(state_dir, key, series.directory)
    return name, found, sorted([*patches, found], key=lambda p: p.number) if found is not None else patches


@dataclass(frozen=True)
class ProbeTarget:
    """The patch `probe check` checks and the series it stacks it on: from `patches/`, or from the applied tree
    where that holds commits not exported yet among the patch and those before it (what the user works on)."""

    name: str
    patch: Patch | None  # None while the commit `vpatch new` started changes nothing
    patches: tuple[Patch, ...]
    from_tree: tuple[str, ...] = ()  # the files read from the applied tree's commits instead of patches/
    tree: Path | None = None
    dirty: tuple[str, ...] = ()  # uncommitted paths of the applied tree (never checked)


def probe_target(series: Series, state_dir: Path, key: str) -> ProbeTarget:
    """`find_patch`, reading the applied tree's version of the patches it has not exported (see ProbeTarget)."""

    name, found, patches = find_patch(series, state_dir, key)
    work = tree_work(series, state_dir)
    if work is None:
        return ProbeTarget(name, found, tuple(patches))
    in_tree = next((p for p in work.patches if p.name == name), None)
    if in_tree is None and found is not None and f"{name}.patch" in work.unexported:  # exported, emptied since
        raise ProbeError(f"the applied tree's commit of {name}.patch changes nothing now (its change was taken out "
                         f"after it was exported): the tree holds no {name} to check, and patches/ still has the "
                         "change; not checking patches/ in the tree's place",
                         hint=f"put the change back in {work.tree} (`git -C {work.tree} reflog` shows the commit "
                              "before the amend), or `vpatch apply --force` to take patches/ back into the tree")
    if in_tree is None:
        return ProbeTarget(name, found, tuple(patches), tree=work.tree, dirty=work.dirty)
    upto = [p for p in work.patches if p.number <= in_tree.number]
    from_tree = tuple(n for n in work.unexported if n in {p.filename for p in upto})
    if not from_tree:
        return ProbeTarget(name, found, tuple(patches), tree=work.tree, dirty=work.dirty)
    return ProbeTarget(name, in_tree, work.patches, from_tree, work.tree, work.dirty)


def check_probe(evidence: Witness, patches: Sequence[Patch], patch: Patch, *, base: str, ref: str,
          use_cache: bool = True) -> Checked:
    """The patch's probe on `base` and on `base` + the series up to it (runner.validation decides, asked through
    the command's Witness), the two sides at once where its jobs allow."""
    probe = probe_for(patch)
    if probe is None:
        raise ProbeError(f"{patch.filename} names no probe",
                         hint=f"vpatch probe new {patch.number:04d} --kind files (or command) writes one; then add "
                              f"'{PROBE}: {probe_name(patch.name)}' to the patch's trailers")
    patched = stacked_tree(evidence.repo, patches, base, patch, name=ref)
    found = evidence.validation(probe, patch.filename, base=base, patched=patched, base_name=ref, use_cache=use_cache)
    return Checked(patch.filename, probe.name, ref, base, found)


def probe_name(patch_name: str) -> str:
    """Where `probe new` puts the probe of `NNNN-slug`, as a Probe: trailer names it."""
    return f"probes/{patch_name}.yaml"


def write_probe_template(patches_dir: Path, patch_name: str, kind: ProbeKind, *, patch: Patch | None = None) -> list[Path]:
    """Write the probe template for `patch_name` (and, for a command probe, its script); refuses to overwrite."""
    folder = patches_dir / "probes"
    yaml_path = patches_dir / probe_name(patch_name)
    files = {yaml_path: _files_yaml(patch_name, patch)} if kind is ProbeKind.FILES else {
        yaml_path: _command_yaml(patch_name, lock=(folder / LOCK_NAME).is_file()),
        folder / f"{patch_name}.py": _command_script(patch_name),
    }
    taken = [p for p in files if p.exists()]
    if taken:
        raise ProbeError(f"{taken[0]} exists already", hint="edit it, or remove it to start from the template again")
    for path, text in files.items():
        atomic_write(path, text.encode())
    return list(files)


def _files_yaml(patch_name: str, patch: Patch | None) -> str:
    path, added, removed = _first_change(patch)
    lines = [
        f"# {patch_name}: what this probe checks, in one line.",
        "# kind: files reads each file from the tree (nothing is checked out). Every string under",
        "# contains must be in the file, none under not_contains. It must FAIL on the pin (the bug is",
        "# there) and PASS with the patch: `vpatch probe check " + patch_name[:4] + "` runs both.",
        "# Choose strings any fix of the bug must have (upstream may word the fix differently from",
        "# this patch); a file missing from the tree is never evidence.",
        "kind: files",
        "files:",
        f"  {path}:",
        f"    contains: [{_yaml_str(added)}]",
    ]
    if removed is not None:
        lines.append(f"    not_contains: [{_yaml_str(removed)}]")
    return "\n".join(lines) + "\n"


def _first_change(patch: Patch | None) -> tuple[str, str, str | None]:
    """The first changed file of the patch, a line it adds and a line it removes (suggestions to edit)."""
    for fd in patch.files if patch is not None else ():
        if fd.new_path is None or not fd.hunks:
            continue
        body = b"".join(h.text.split(b"\n", 1)[1] for h in fd.hunks).decode("utf-8", "replace").splitlines()
        added = [line[1:].strip() for line in body if line.startswith("+") and len(line[1:].strip()) >= 4]
        removed = [line[1:].strip() for line in body if line.startswith("-") and len(line[1:].strip()) >= 4]
        if added:
            return fd.new_path, added[0], removed[0] if removed else None
    return "vllm/path/to/file.py", "a line only the fixed file has", "a line only the buggy file has"


def _yaml_str(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _command_yaml(patch_name: str, *, lock: bool) -> str:
    env = (f"lock: {LOCK_NAME}  # the probe venv's pins, shared by the behavioural probes" if lock else
           "requirements: []  # pip requirements of the probe venv, e.g. [\"torch==2.9.0\"] (default: none)")
    return "\n".join([
        f"# {patch_name}: what this probe drives, in one line.",
        "# kind: command runs `run` in a checkout of the tree (the working folder is the tree root, which is",
        "# also first on PYTHONPATH). {python} is the probe venv's python, {probe_dir} this folder, {tree}",
        "# the tree root. Exit 0 = the fix is there, 1 = the bug is there, anything else = could not decide.",
        f"# It must fail on the pin and pass with the patch: `vpatch probe check {patch_name[:4]}` runs both.",
        "kind: command",
        f'run: ["{{python}}", "{{probe_dir}}/{patch_name}.py"]',
        env,
        "timeout: 900  # seconds (the default); past it the probe is an error",
    ]) + "\n"


def _command_script(patch_name: str) -> str:
    return COMMAND_PROBE.read_text(encoding="utf-8").replace(NAME, patch_name, 1)
