"""`vpatch probe check` and `vpatch probe new`: write a patch's probe and check it the way `update` does."""

from __future__ import annotations

from pathlib import Path

from vpatch import upstream
from vpatch.base import ExitCode, VpatchError
from vpatch.commands import echo, load_config, load_series, warn_stopped_update
from vpatch.probes import ProbeKind, Witness, check_probe, find_patch, probe_name, probe_target, write_probe_template
from vpatch.report import ProgressView, checked_lines, dirty_warning, tree_lines, written_lines
from vpatch.series import PROBE


def check(*, project: Path, patch: str, ref: str | None, no_cache: bool, jobs: int | None = None) -> ExitCode:
    config = load_config(project)
    warn_stopped_update(config)
    found = probe_target(load_series(config), config.state_dir, patch)
    name, target, patches = found.name, found.patch, found.patches
    for line in tree_lines(found, config.patches):
        echo(line)
    warning = dirty_warning(found)
    if warning is not None:
        echo(warning, err=True)
    if target is None:
        raise VpatchError(f"{name} changes nothing yet",
                          hint="make the change in the applied tree and `git commit --amend -a` it first")
    repo = upstream.open_upstream(config)
    base = upstream.pin_commit(repo, config, moved_ok=True) if ref is None else upstream.resolve(repo, ref)
    with ProgressView() as view, Witness(repo, config, report=view, jobs=jobs) as evidence:
        checked = check_probe(evidence, patches, target, base=base, ref=ref or config.pin.ref, use_cache=not no_cache)
    for line in checked_lines(checked, target.name):
        echo(line)
    result_of = checked.validation
    if not result_of.ok:
        raise VpatchError(result_of.detail, hint=result_of.hint or None)
    echo(f"ok: {result_of.detail}")
    return ExitCode.OK


def new(*, project: Path, patch: str, kind: str) -> ExitCode:
    if kind not in ("files", "command"):
        raise VpatchError(f"--kind must be files or command, not {kind!r}", exit_code=ExitCode.USAGE,
                          hint=f"vpatch probe new {patch} --kind files (or --kind command)")
    config = load_config(project)
    warn_stopped_update(config)
    name, found, _ = find_patch(load_series(config), config.state_dir, patch)
    written = write_probe_template(config.patches_dir, name, ProbeKind(kind), patch=found)
    named = found.filename if found is not None and found.trailer(PROBE) == probe_name(name) else None
    for line in written_lines(written, name, f"{PROBE}: {probe_name(name)}", named=named):
        echo(line)
    return ExitCode.OK
