"""`vpatch probe check` and `vpatch probe new`: write a patch's probe and check it the way `update` does."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from vpatch import upstream
from vpatch.base import ExitCode, VpatchError
from vpatch.commands import echo, load_config, load_series, warn_stopped_update
from vpatch.probes import (
    ProbeKind,
    Witness,
    check_probe,
    find_patch,
    hunk_coverage,
    listed,
    probe_for,
    probe_name,
    probe_target,
    runs_tests,
    stacked_tree,
    write_probe_template,
    zygote_pays,
)
from vpatch.report import ProgressView, checked_lines, coverage_lines, dirty_warning, regression_lines, tree_lines, written_lines
from vpatch.series import PROBE


def check(*, project: Path, patch: str, ref: str | None, no_cache: bool, jobs: int | None = None,
          hunks: bool = True, upstream_tests: bool = True) -> ExitCode:
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
    where = ref or config.pin.ref
    patched = stacked_tree(repo, patches, base, target, name=where)
    # One session for the whole check: each tree extracted once (the two sides' trees serve upstream's tests too);
    # its runs - the two sides, one without each hunk, upstream's tests on both sides where there are any - go
    # through a warm interpreter only where it pays
    tested_here = upstream_tests and runs_tests(repo, target, base=base, patched=patched)
    runs = 2 + (sum(len(fd.hunks) for fd in target.files) if hunks else 0) + (2 if tested_here else 0)
    warm = zygote_pays(runs, jobs, listed=listed(probe_for(target)))
    # (the pool outlives the session: an error ends the session's runs first, then the pool waits for its thread)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="upstream-tests") as beside, \
            Witness(repo, config, jobs=jobs, zygote=warm) as evidence:
        with ProgressView() as view:
            evidence.report = view
            # upstream's tests from the start, beside the probe's sides and hunks (the session holds all the runs to
            # --jobs at once); an invalid probe ends them with the session
            testing = beside.submit(evidence.regressions, target, base=base, patched=patched, ref=where,
                                    use_cache=not no_cache) if upstream_tests else None
            checked = check_probe(evidence, patches, target, base=base, ref=where, use_cache=not no_cache)
            result_of = checked.validation
            if not result_of.ok and evidence.session is not None:
                evidence.session.cancel.set()
            # Evidence both ways: which hunks the probe proves, and whether the patch breaks upstream's own tests.
            covered = hunk_coverage(repo, patches, target, base=base, ref=where, use_cache=not no_cache, report=view,
                                    session=evidence.session) if hunks and result_of.ok else None
            tested = testing.result() if testing is not None and result_of.ok else None
        for line in checked_lines(checked, target.name):
            echo(line)
        if not result_of.ok:
            raise VpatchError(result_of.detail, hint=result_of.hint or None)
        echo(f"ok: {result_of.detail}")
        # said before the session ends: removing its trees takes seconds the answer need not wait for
        if covered is not None:
            for line in coverage_lines(covered):
                echo(line)
        if tested is not None:
            for line in regression_lines(tested):
                echo(line)
            if tested.regressed:
                raise VpatchError(f"{target.filename} breaks upstream's own tests on {where}: "
                                  f"{', '.join(tested.regressed)}",
                                  hint="they pass without the patch: change the patch so that they pass with it")
            if not tested.complete:  # no evidence either way (e.g. a module the probe venv lacks): said, not refused
                echo(f"warning: {tested.says()}", err=True)
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
