"""`vpatch probe check` and `vpatch probe new`: write a patch's probe and check it the way `update` does."""

from __future__ import annotations

from pathlib import Path

from vpatch.base import ExitCode, VpatchError
from vpatch.commands import echo, load_config, load_series


def check(*, project: Path, patch: str, ref: str | None, no_cache: bool, jobs: int | None = None) -> ExitCode:
    from vpatch import upstream
    from vpatch.probes import check as core
    from vpatch.report import ProgressView

    config = load_config(project)
    found = core.target(load_series(config), config.state_dir, patch)
    name, target, patches = found.name, found.patch, found.patches
    if found.from_tree:
        echo(f"reading {', '.join(found.from_tree)} from the applied tree {found.tree} (its commits differ from "
             f"{config.patches}/: not exported yet; `vpatch export` writes them)")
    if found.dirty:
        echo(f"warning: uncommitted changes in the applied tree are not checked: {', '.join(found.dirty[:5])}"
             " (commit them: git commit --amend -a)", err=True)
    if target is None:
        raise VpatchError(f"{name} changes nothing yet",
                          hint="make the change in the applied tree and `git commit --amend -a` it first")
    repo = upstream.open_upstream(config)
    base = upstream.pin_commit(repo, config, moved_ok=True) if ref is None else upstream.resolve(repo, ref)
    with ProgressView() as view:
        checked = core.check(repo, patches, target, base=base, ref=ref or config.pin.ref,
                             use_cache=not no_cache, report=view, jobs=jobs)
    result_of = checked.validation
    for side, result in ((f"on {checked.ref} ({base[:12]})", result_of.base),
                         (f"on {checked.ref} + the series up to {target.name}", result_of.patched)):
        if result is None:
            echo(f"{checked.probe} {side}: not run (the other side errored, which decides already)")
            continue
        echo(f"{checked.probe} {side}: {result.outcome.value.upper()}"
             + (" (from the cache)" if result.cached else f" in {result.seconds:.1f}s"))
        for line in (result.detail or "(no output)").splitlines():
            echo(f"    {line}")
    if not result_of.ok:
        raise VpatchError(result_of.detail, hint=result_of.hint or None)
    echo(f"ok: {result_of.detail}")
    return ExitCode.OK


def new(*, project: Path, patch: str, kind: str) -> ExitCode:
    from vpatch.probes import ProbeKind
    from vpatch.probes import check as core
    from vpatch.series import PROBE

    if kind not in ("files", "command"):
        raise VpatchError(f"--kind must be files or command, not {kind!r}", exit_code=ExitCode.USAGE,
                          hint=f"vpatch probe new {patch} --kind files (or --kind command)")
    config = load_config(project)
    name, found, _ = core.find_patch(load_series(config), config.state_dir, patch)
    written = core.write_template(config.patches_dir, name, ProbeKind(kind), patch=found)
    for path in written:
        echo(f"wrote {path}")
    trailer = f"{PROBE}: {core.probe_name(name)}"
    if found is not None and found.trailer(PROBE) == core.probe_name(name):
        echo(f"{found.filename} already names it ({trailer})")
    else:
        echo(f"name it in the patch's trailers: {trailer} (in the applied tree: `git commit --amend`, then `vpatch export`)")
    echo(f"edit it, then `vpatch probe check {name[:4]}`: it must fail on the pin and pass with the patch")
    return ExitCode.OK
