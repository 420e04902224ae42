"""The command line: parse, load config, call one core function, show the result. Only module that prints."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperGroup

from vpatch.definition import Strategy
from vpatch.errors import ExitCode, VpatchError

if TYPE_CHECKING:
    from vpatch.config import Config
    from vpatch.series import Series
    from vpatch.update import Result as UpdateResult


class _Group(TyperGroup):
    """Turns VpatchError into 'error:'/'hint:' lines and its exit code, for the CLI and CliRunner alike."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except VpatchError as exc:
            if state.debug:
                import traceback

                traceback.print_exc()
            echo(f"error: {exc.message}", err=True)
            if exc.hint:
                echo(f"hint: {exc.hint}", err=True)
            raise typer.Exit(int(exc.exit_code)) from None
        except KeyboardInterrupt:
            echo("interrupted", err=True)
            raise typer.Exit(int(ExitCode.INTERRUPTED)) from None


app = typer.Typer(
    cls=_Group,
    name="vpatch",
    help="Keep a production vLLM image as a pinned upstream commit plus a numbered series of local diffs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


class _State:
    debug = False
    project: Path = Path(".")


state = _State()


def _show_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        echo(f"vpatch {version('vpatch')}")
        raise typer.Exit()


@app.callback()
def _options(
    project: Annotated[Path, typer.Option("--project", "-C", help="Project folder holding vpatch.yaml.")] = Path("."),
    debug: Annotated[bool, typer.Option("--debug", help="Show a traceback for every error.")] = False,
    _version: Annotated[bool, typer.Option("--version", callback=_show_version, is_eager=True,
                                           help="Print vpatch's version and exit.")] = False,
) -> None:
    state.project = project
    state.debug = debug


def echo(text: str = "", *, err: bool = False) -> None:
    typer.echo(text, err=err)


def _console() -> Any:
    """A rich console; when output is not a terminal (CI logs, pipes) tables get room instead of 80 columns."""
    import os

    from rich.console import Console

    width = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS") or 160)
    return Console(soft_wrap=False, width=width)


def _config() -> Config:
    from vpatch.config import Config, find_root
    from vpatch.series import stray_files

    config = Config.load(find_root(state.project.resolve()))
    stray = stray_files(config.patches_dir)
    if stray:
        echo(f"warning: ignored in {config.patches}/ (only NNNN-slug.patch files are the series): {', '.join(stray)}",
             err=True)
    return config


def _series(config: Config) -> Series:
    from vpatch.series import Series

    return Series.load(config.patches_dir)


@app.command()
def fetch(
    blob_filter: Annotated[str | None, typer.Option("--filter", help="blob:none: a partial mirror (every commit and "
                                                    "tree; file contents fetched when first read).")] = None,
) -> None:
    """Create or update the upstream mirror (a bare git repository in the cache); git's progress on stderr."""
    from vpatch.console import ProgressView
    from vpatch.upstream import cache_dir, mirror

    config = _config()
    if config.upstream.source == "releases":
        raise VpatchError("this project reads upstream from the release history, not a git mirror",
                          hint="vpatch releases refreshes the release history")
    with ProgressView() as view:
        path = mirror.fetch(cache_dir(), config.upstream.git, blob_filter=blob_filter, report=view)
    echo(f"mirror of {config.upstream.git} is up to date at {path}")


@app.command(name="releases")
def releases_(
    versions: Annotated[list[str] | None, typer.Argument(help="Releases to add, e.g. 0.30.0 0.31.0.", show_default=False)] = None,
    first: Annotated[str | None, typer.Option("--from", help="Add every release PyPI offers from this one on.")] = None,
    last: Annotated[str | None, typer.Option("--to", help="...up to and including this one (default: the newest).")] = None,
    pre: Annotated[bool, typer.Option("--pre", help="Let --from/--to include pre-releases.")] = False,
    list_only: Annotated[bool, typer.Option("--list", help="Only list what the history holds; download nothing.")] = False,
) -> None:
    """Build or refresh the release history: a git repository of vLLM releases made from PyPI sdists.

    One commit per release in version order, tagged vX.Y.Z, with the same SHAs on every machine. \
Only missing releases are downloaded (from the index pip is configured with, hash-checked, nothing built) and added. \
Without arguments it refreshes: every release from 0.28.0 \
(or the oldest it holds, or the project's pin, if older) to the newest on PyPI.

    Example: vpatch releases --from 0.28.0 --to 0.33.0
    """
    import datetime

    from vpatch.config import CONFIG_NAME, find_root
    from vpatch.upstream import cache_dir, releases

    root = find_root(state.project.resolve())
    pin = _config().pin.ref if (root / CONFIG_NAME).is_file() else None
    if list_only:
        result = releases.list_releases()
    else:
        from vpatch.console import ProgressView

        with ProgressView() as view:
            result = releases.update(versions or [], first=first, last=last, pre=pre, pin=pin, report=view)
    if not result:
        echo(f"the release history is empty ({releases.history_path(cache_dir())})", err=True)
        echo("hint: vpatch releases --from 0.28.0 --to 0.33.0", err=True)
        return
    for r in result:
        day = datetime.datetime.fromtimestamp(r.date, datetime.UTC).strftime("%Y-%m-%d")
        echo(f"{r.tag:<12} {r.commit[:12]}  {day}  {r.state.value}")
    echo(f"release history: {releases.history_path(cache_dir())}", err=True)


@app.command(name="lock-probes")
def lock_probes(
    lock: Annotated[Path | None, typer.Option("--lock", help="The lock file (default: probes/requirements.lock "
                                                 "in the patches folder).")] = None,
) -> None:
    """Refresh the probe venv's lock on purpose: resolve its '# requires:' line afresh, leave out '# omit:'.

    Every probe that uses the lock gets a new venv and new verdicts (the lock is part of both keys).
    Commit the changed lock with the reason for the refresh.
    """
    from vpatch import probe_env

    path = lock or _config().patches_dir / "probes" / probe_env.LOCK_NAME
    echo(f"resolving {path.name} with pip (nothing is installed)...", err=True)
    change = probe_env.refresh_lock(path)
    for name, old, new in change.moved:
        echo(f"{name} {old} -> {new}")
    for line in change.added:
        echo(f"+ {line}")
    for line in change.removed:
        echo(f"- {line}")
    if not (change.moved or change.added or change.removed):
        echo(f"{path.name}: unchanged", err=True)


@app.command()
def apply(
    ref: Annotated[str | None, typer.Option("--ref", help="Upstream ref to apply onto (default: the pin).")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Folder for the work tree (default: .vpatch/tree).")] = None,
    keep: Annotated[bool, typer.Option(
        "--keep", help="On failure keep the tree with the patches before the failing one, to fix it.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing tree even if it holds work not yet exported.")] = False,
) -> None:
    """Materialise a work tree of the pin (or REF) with each patch committed as one commit."""
    from vpatch import git, lock, stack, upstream

    config = _config()
    series = _series(config)
    repo = upstream.open_upstream(config)
    target = ref or config.pin.ref
    base = upstream.pin_commit(repo, config, moved_ok=True) if ref is None else upstream.resolve(repo, target)
    if ref is None and config.pin.commit and git.resolve_commit(repo, config.pin.ref) != config.pin.commit:
        echo(f"warning: {config.pin.ref} now names another commit upstream; applying onto the recorded {config.pin.commit[:12]}", err=True)
    with lock.held(config.root, "apply"):
        # onto another ref, files upstream moved since the pin are followed (docs/moves.md)
        pin = upstream.pin_commit(repo, config, moved_ok=True) if ref is not None else None
        result = stack.apply_series(repo, series, ref=target, base=base, out=out or config.state_dir / "tree",
                                    state_dir=config.state_dir, keep=keep, force=force, moves_from=pin)
    echo(f"applied {len(result.applied)} patch(es) onto {target} ({base[:12]}) in {result.worktree}")
    for a in result.applied:
        echo(f"  {a.commit[:12]} {a.file}")
    echo("edit the commits there (amend, add a commit for a new patch), then run `vpatch export`")


@app.command()
def export(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would change; write nothing.")] = False,
) -> None:
    """Write the commits of the applied tree back to the numbered patch files."""
    from vpatch import lock, stack
    from vpatch.series import Series

    config = _config()
    with lock.held(config.root, "export"):
        # a file whose diff no longer parses (a hand-edited hunk) is written afresh from its commit in the tree
        series = Series.load(config.patches_dir, unreadable_ok=True)
        result = stack.export_series(series, config.state_dir, dry_run=dry_run)
    for planned, done, names in (("would change", "changed", result.changed), ("would add", "added", result.added),
                                 ("would remove", "removed", result.removed)):
        for name in names:
            echo(f"{planned if dry_run else done}: {name}")
            if name in result.rewritten:
                echo(f"  {'' if dry_run else 'it '}did not parse ({dict(series.unreadable)[name].message}); "
                     "written afresh from its commit in the applied tree")
            if name in result.unmarked:
                echo("  note: a new patch, from a commit without a Vpatch-File line (a plain `git commit` in the "
                     "tree); to change an existing patch instead, fold it into that commit (git rebase -i, "
                     "fixup) or use `git commit --amend`, then export again (the new file goes)")
    if not (result.changed or result.added or result.removed):
        echo(f"nothing to export: {len(result.unchanged)} patch(es) unchanged")


@app.command()
def new(
    slug: Annotated[str, typer.Argument(help="Short name of the patch, e.g. fix-parser (lower case, dashes).")],
    subject: Annotated[str | None, typer.Option("--subject", help="First line of the patch message.")] = None,
) -> None:
    """Start a new patch: an empty commit with the header template in the applied tree."""
    from vpatch import lock, newpatch

    config = _config()
    with lock.held(config.root, "new"):
        name, tree = newpatch.start(_series(config), config.state_dir, slug=slug, subject=subject)
    echo(f"started {name} as an empty commit in the applied tree {tree}")
    echo("next: make the change in that tree, then (keeping the message's trailers, filling or deleting the <...> ones):")
    echo(f"  git -C {tree} commit --amend -a")
    echo(f"  vpatch probe new {name[:4]} --kind files     # or --kind command; or delete the Probe: line")
    echo("  vpatch export")


@app.command()
def build(
    name: Annotated[str, typer.Argument(help="Image definition to build: images/NAME.yaml.")],
    plan: Annotated[bool, typer.Option("--plan", help="Show strategy, reason, exact build command and tags; build nothing.")] = False,
    push: Annotated[bool, typer.Option("--push", help="Push both tags to the registry named in the image definition.")] = False,
    strategy: Annotated[Strategy | None, typer.Option(
        "--strategy", help="Override the definition's strategy (default there: auto).", case_sensitive=False)] = None,
    base: Annotated[str | None, typer.Option(
        "--base", help="Base image to overlay instead of the definition's (a local mirror of it).")] = None,
) -> None:
    """Build the production image for the pin plus the series, by the cheapest correct strategy."""
    from vpatch.image import build as image_build
    from vpatch.image.plan import describe

    config = _config()
    if plan:
        result = image_build.plan_build(config, name, strategy=strategy, base=base)
        for line in describe(result, image_build.plan_command(result)):
            echo(line)
        return
    # Build progress goes to stderr; stdout keeps only the result (scripts read the tags from it).
    built = image_build.build_image(config, name, strategy=strategy, base=base, push=push,
                                    progress=lambda line: echo(line, err=True))
    verb = "reused" if built.reused else f"built in {built.seconds:.1f}s"
    echo(f"{verb}: {built.image_id[:19]} ({built.plan.strategy.value}: {built.plan.reason})")
    for tag in built.plan.tags:
        digest = built.pushed.get(tag)
        echo(f"  {tag}" + (f"  pushed {digest}" if digest else ""))


@app.command()
def verify(
    image: Annotated[str, typer.Argument(help="Image to check against its own labels (tag or id).")],
    probes: Annotated[bool, typer.Option("--probes", help="Also run the patches' probes inside the image.")] = False,
    live: Annotated[bool, typer.Option("--live", help="Also start the image (its definition's serve: section, "
                                       "a free port) and run the patches' live checks against it.")] = False,
    definition: Annotated[str | None, typer.Option(
        "--definition", help="With --live: the images/NAME.yaml to start it with (default: the image's own label).")] = None,
) -> None:
    """Check that an image holds what its labels say: each patched file, optionally the probes and the live checks."""
    from vpatch.image import verify as image_verify

    if definition is not None and not live:
        raise VpatchError("--definition names the image definition that --live starts the image with",
                          hint=f"vpatch verify {image} --live --definition {definition}")
    config = _config()
    report = image_verify.verify_image(config, image, probes=probes)
    for check in report.checks:
        echo(f"{check.mark} {check.what}" + (f": {check.detail}" if check.detail else ""))
    if report.ok and live:
        _verify_live(config, image, definition)
    if not report.ok:
        failed = [c for c in report.checks if not c.ok]
        only_probes = all(c.kind is image_verify.CheckKind.PROBE for c in failed)
        raise VpatchError(f"image {image} does not match its labels: {len(failed)} check(s) failed",
                          hint="a probe's FAIL: the fix is not in the image; ERROR: the probe could not decide (a crash, "
                          "a timeout, a missing file: it may need vLLM's dependencies, which an official image has)" if only_probes
                          else "rebuild it with `vpatch build`")
    echo(f"image {image} matches its labels: {len(report.checks)} check(s) passed")


def _verify_live(config: Config, image: str, definition: str | None) -> None:
    from vpatch.deploy import live as deploy_live
    from vpatch.image.docker import Docker
    from vpatch.upstream import cache_dir

    result = deploy_live.verify_live(config, image, definition=definition, docker=Docker.connect(), cache=cache_dir(),
                                     progress=lambda line: echo(line, err=True))
    for note in result.plan.notes:
        echo(f"note {note}")
    for outcome in result.candidate:
        for case in outcome.cases:
            shown = "" if case.ok else ": " + "; ".join(case.problems)
            echo(f"{'ok  ' if case.ok else 'FAIL'} live {outcome.planned.patch}: {case.name}{shown}")
    failed = [o for o in result.candidate if not o.ok]
    if failed:
        raise VpatchError(f"image {image} fails the live check of {', '.join(o.planned.patch for o in failed)}",
                          hint="the fix does not show through the server; `vpatch verify --live` again after "
                          "fixing the patch and rebuilding")
    if result.candidate:
        echo(f"live checks: {sum(len(o.cases) for o in result.candidate)} case(s) passed")
    else:
        echo("live checks: none to run (no patch in the image names a Live-Check); nothing was started")


@app.command()
def serve(
    name: Annotated[str, typer.Argument(help="Image definition whose serve: section to run: images/NAME.yaml.")],
    print_only: Annotated[bool, typer.Option("--print", help="Print the exact `docker run` (shell-quoted); start nothing.")] = False,
    diff: Annotated[bool, typer.Option("--diff", help="Compare the running container with the yaml; exit 7 on drift.")] = False,
    image: Annotated[str | None, typer.Option("--image", help="Run this image instead of the definition's moving tag.")] = None,
    replace: Annotated[bool, typer.Option("--replace", help="Replace a container of the same name (after the lint passed).")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="With --diff: one JSON document.")] = False,
    check: Annotated[bool, typer.Option(
        "--check", help="Is the running server alive (the container health check's rule)? Exit 0 alive, 1 not.")] = False,
) -> None:
    """Start the server as images/NAME.yaml's serve: section says: lint it against the image, run it, wait for /health.

    --print shows the exact `docker run` that would run; --diff shows how the running container differs.
    """
    from vpatch.definition import ImageDefinition
    from vpatch.serve import render

    # The whole definition, every section and the rules between them, before anything is shown or touched.
    definition = ImageDefinition.load(_config().root, name).validate()
    if print_only:
        echo(render.for_definition(definition, image=image).shell_line())
        return
    from vpatch.image.docker import Docker
    from vpatch.upstream import cache_dir

    docker = Docker.connect()
    if check:
        from vpatch.deploy.journal import Journal
        from vpatch.serve import run as serve_run

        checked = serve_run.check(docker, definition, state_dir=Journal.folder().parent / "serve")
        health = f", docker health {checked.docker_health}" if checked.docker_health else ", no docker health check"
        echo(f"{checked.container} ({checked.status}{health}): {checked.verdict.line()}")
        if not checked.alive:
            raise typer.Exit(int(ExitCode.ERROR))
        return
    if diff:
        from vpatch.serve import drift

        result = drift.diff(docker, definition, image=image, pin=_config().pin)
        if json_out:
            import json

            echo(json.dumps({"container": result.container.name, "image": result.image,
                             "running_image": result.running_image,
                             "drifts": [vars(d) for d in result.drifts]}, indent=2))
        elif result.drifts:
            echo(f"{result.container.name} differs from images/{name}.yaml:")
            width = max(len(d.what) for d in result.drifts)
            for d in result.drifts:
                echo(f"  {d.what:<{width}}  yaml: {d.yaml}")
                echo(f"  {'':<{width}}  running: {d.running}")
        else:
            echo(f"{result.container.name} runs exactly what images/{name}.yaml says: {result.running_image}")
        if result.drifts:
            raise typer.Exit(int(ExitCode.DRIFT))
        return
    from vpatch.serve import run

    served = run.serve(docker, definition, cache=cache_dir(), image=image, replace=replace,
                       progress=lambda line: echo(line, err=True))
    echo(f"{served.command.name} ({served.container_id[:12]}) is healthy after {served.seconds_to_healthy:.0f}s: "
         f"{run.health_url(definition.serve.port if definition.serve else 0)}")
    echo(f"lint: entrypoint `{' '.join(served.lint.entrypoint)}`, {len(served.lint.flags)} flag(s) known to "
         f"vLLM {served.lint.vllm_version}")


@app.command()
def status(
    against: Annotated[list[str] | None, typer.Option(
        "--against", help="Upstream ref to judge on; repeat it for several. Default: the newest release and, "
        "with a git upstream, the branch tip. The pin is always a column.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document (for CI) instead of the table.")] = False,
    exit_code: Annotated[bool, typer.Option(
        "--exit-code", help="Exit 3 when some patch landed (can be dropped), 4 when some patch conflicts or is partial.")] = False,
    no_probes: Annotated[bool, typer.Option("--no-probes", help="Textual evidence only: run no probe.")] = False,
) -> None:
    """Which patches upstream has (with the evidence), since which commit and release, and which still need you."""
    from vpatch import report, upstream
    from vpatch import status as core
    from vpatch.trailers import refuse_unfinished

    config = _config()
    series = _series(config)
    refuse_unfinished(series.patches, where="edit the patch file (or amend the commit in the applied tree and export)")
    repo = upstream.open_upstream(config)
    pin, targets = core.resolve_targets(repo, config, against or ())
    from vpatch.console import ProgressView

    names = {t.commit: t.ref for t in [*targets, pin]}
    with ProgressView() as view:
        result = core.compute(
            repo, series.patches, pin=pin, targets=targets, history=config.upstream.source == "git",
            branch=config.upstream.branch,
            probe=None if no_probes else core.probe_fn(repo, config, report=view, names=names), report=view,
        )
    if json_out:
        import json

        echo(json.dumps(report.status_json(result), indent=2))
    else:

        _console().print(report.status_table(result))
    if exit_code:
        raise typer.Exit(int(result.exit_code()))


@app.command()
def update(
    to: Annotated[str | None, typer.Option("--to", help="Upstream ref to move the pin to, e.g. v0.31.0.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan (verdicts and actions); change nothing.")] = False,
    no_commit: Annotated[bool, typer.Option("--no-commit", help="Stage the change in the project; do not commit it.")] = False,
    allow_downgrade: Annotated[bool, typer.Option("--allow-downgrade", help="Allow a REF that does not descend from the pin.")] = False,
    no_narrow: Annotated[bool, typer.Option("--no-narrow", help="Stop at a partly-landed patch instead of narrowing it.")] = False,
    continue_: Annotated[bool, typer.Option("--continue", help="Go on after resolving the conflict in the update tree.")] = False,
    abort: Annotated[bool, typer.Option("--abort", help="Throw the stopped update away; the project is as before it.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as one JSON document (for CI).")] = False,
) -> None:
    """Move the pin: drop the patches upstream has (with evidence), refresh the rest, one commit; or stop on a conflict."""
    from vpatch import update as core

    if sum(bool(x) for x in (to, continue_, abort)) != 1:
        raise VpatchError("give exactly one of --to REF, --continue, --abort", exit_code=ExitCode.USAGE,
                          hint="vpatch update --to v0.31.0 [--dry-run]")
    import functools

    from vpatch.console import ProgressView

    config = _config()
    with ProgressView() as view:
        validator = functools.partial(core.validate_with_probes, report=view)
        if abort:
            result = core.abort(config)
        elif continue_:
            result = core.resume(config, validator=validator)
        else:
            assert to is not None
            try:
                result = core.update(config, to, dry_run=dry_run, no_commit=no_commit,
                                     allow_downgrade=allow_downgrade, narrow=not no_narrow,
                                     judge=functools.partial(core.judge_with_status, progress=view),
                                     validator=validator)
            except core.Refused as refused:
                # the dry run's refusal comes after the judging: show the table it refused on, then the error
                from vpatch import report
                from vpatch.status import Status

                if isinstance(refused.report, Status) and not json_out:
                    _console().print(report.status_table(refused.report))
                raise
    if json_out:
        import json

        echo(json.dumps(result.to_json(), indent=2))
    else:
        for line in _update_lines(result):
            echo(line)
    if result.outcome is core.Outcome.STOPPED:
        raise typer.Exit(int(ExitCode.CONFLICT))


def _update_lines(result: UpdateResult) -> list[str]:
    from vpatch.update import Action, Outcome

    plan = result.plan
    lines = []
    if result.outcome is Outcome.ABORTED:
        return [f"aborted the update to {plan.to_ref}; the project is as it was (pin {plan.from_ref})"]
    if result.outcome is Outcome.UP_TO_DATE:
        return [f"already there: the pin {plan.from_ref} is {plan.to_ref} ({plan.to_commit[:12]}); nothing changed"]
    if result.outcome is Outcome.PLANNED and plan.report is not None:
        from vpatch import report
        from vpatch.status import Status

        assert isinstance(plan.report, Status)
        _console().print(report.status_table(plan.report))
    head = "plan" if result.outcome is Outcome.PLANNED else "update"
    lines.append(f"{head}: pin {plan.from_ref} ({plan.from_commit[:12]}) -> {plan.to_ref} ({plan.to_commit[:12]})")
    for row in plan.patches:
        verb = row.verb(planned=result.outcome is Outcome.PLANNED)  # the decision's words (decision.py)
        lines.append(f"  {verb:<14} {row.file}  [{row.state}] {row.decided_by}")
        lines += [f"  {'':<14} moved: {move}" for move in row.moves if f"moved: {move}" != row.decided_by]
        if row.move_proof:
            lines.append(f"  {'':<14} proof: {row.move_proof}")
        if row.action is Action.DROP:
            lines.append(f"  {'':<14} Applied-Upstream: {row.landed_in}")
        if row.narrowing is not None:
            lines.append(f"  {'':<14} {row.narrowing.summary}: "
                         + "; ".join(f"{h.name} upstream in {h.landed_in}" for h in row.narrowing.dropped))
            lines.append(f"  {'':<14} proof: {row.narrowing.proof}")
            if row.narrowing.probe != "no probe":
                lines.append(f"  {'':<14} probe: {row.narrowing.probe}")
    for check in result.probes:
        if check.probe:
            lines.append(f"  probe {check.probe} re-validated on {plan.to_ref}" + (f": {check.detail}" if check.detail else ""))
    if result.outcome is Outcome.COMMITTED:
        lines.append(f"committed {(result.commit or '')[:12]}: {result.message.splitlines()[0]}")
    elif result.outcome is Outcome.STAGED:
        lines.append("staged in the project, not committed; the message vpatch would use:")
        lines += ["    " + line for line in result.message.splitlines()]
    elif result.outcome is Outcome.STOPPED:
        stop = result.stop
        assert stop is not None
        lines.append(f"stopped at {stop.file}: {stop.reason}")
        if stop.conflicts:
            lines.append("conflicts in: " + ", ".join(stop.conflicts))
        lines.append(f"resolve it in {stop.worktree} (edit, then `git add`), then run `vpatch update --continue`;")
        lines.append("or `vpatch update --abort` to leave the project as it was")
    if plan.all_landed and result.outcome is not Outcome.STOPPED:
        lines.append(f"no local patch remains: the official vLLM {plan.to_ref} image now suffices")
    return lines


@app.command()
def deploy(
    name: Annotated[str, typer.Argument(help="Image definition to deploy: images/NAME.yaml (serve: and deploy: sections).")],
    image: Annotated[str | None, typer.Option("--image", help="Candidate image (default: the definition's moving tag).")] = None,
    rollback: Annotated[bool, typer.Option(
        "--rollback", help="Bring the parked production container back (after a kill, or after a deploy).")] = False,
    where: Annotated[bool, typer.Option(
        "--status", help="Say where the last deploy stands: journal phase and containers; exit 8 while unfinished.")] = False,
    prune: Annotated[bool, typer.Option(
        "--prune", help="Remove old parked and candidate containers (never the one --rollback brings back).")] = False,
    keep: Annotated[int, typer.Option("--keep", min=0, help="With --prune: keep the N newest of each kind.")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="The report as JSON on stdout.")] = False,
) -> None:
    """Switch production to a new image with checks; roll back by itself when one fails (exit 6)."""
    import json

    from vpatch.definition import ImageDefinition
    from vpatch.deploy import report as deploy_report
    from vpatch.deploy import switch
    from vpatch.image.docker import Docker

    progress = lambda line: echo(line, err=True)  # noqa: E731
    # --status, --rollback and --prune need only the journal and the daemon: recovery never depends on the yaml.
    if where or rollback or prune:
        docker = Docker.connect()
        if where:
            found = switch.status(definition=name, docker=docker)
            if found.journal is None:
                echo(f"no deploy of {name} is recorded on this host")
                return
            j = found.journal
            echo(f"deploy of {name}: {j.phase.value} (started {j.started}, image {j.image})" + (f"; {j.note}" if j.note else ""))
            for role, cname, state in found.containers:
                echo(f"  {role:16} {cname:40} {state}")
            if not j.phase.settled:
                echo(f"unfinished: `vpatch deploy {name} --rollback` restores production")
                raise typer.Exit(int(ExitCode.UNFINISHED))
        elif rollback:
            restored = switch.rollback(definition=name, docker=docker, progress=progress)
            echo(f"rolled back: {switch.describe(restored)}")
        else:
            from vpatch.deploy.prune import prune as prune_left

            pruned = prune_left(docker, name, keep=keep)
            for cname in pruned.removed:
                echo(f"removed {cname}")
            for cname, why in pruned.kept:
                echo(f"kept    {cname} ({why})")
            if not pruned.removed:
                echo("nothing to prune")
        return
    definition = ImageDefinition.load(_config().root, name)
    if definition.serve is None:
        raise VpatchError(f"images/{name}.yaml has no serve: section", hint="deploy starts the candidate from serve:")
    docker = Docker.connect()
    from vpatch.deploy import live
    from vpatch.upstream import cache_dir

    definition.validate()  # every section and the rules between them, before production is touched
    candidate = image or definition.moving_ref
    production = docker.container(definition.serve.container.name)
    # Before anything is touched: verify the candidate against its labels and gather the live checks it owes.
    plan = live.plan(_config(), candidate=candidate, docker=docker, serve=definition.serve, progress=progress,
                     baseline=production.image_id if production is not None and production.status == "running" else None)
    for note in plan.notes:
        echo(f"live checks: {note}", err=True)
    result = switch.deploy(definition=name, serve=definition.serve, suite=definition.deploy, image=candidate,
                           docker=docker, cache=cache_dir(), progress=progress, live=plan)
    if as_json:
        echo(json.dumps(deploy_report.to_json(result), indent=2))
    else:
        _show_deploy(result)
    raise typer.Exit(int(result.decision.exit_code))


def _show_deploy(result: Any) -> None:
    from rich.table import Table

    from vpatch.deploy import report as deploy_report

    console = _console()
    checks = Table(title=f"deploy {result.definition}: {result.image} as {result.container}")
    for column in ("check", "baseline", "candidate", "figure", "s"):
        checks.add_column(column)
    for row in deploy_report.check_rows(result):
        checks.add_row(*row)
    console.print(checks)
    figures = Table(title="baseline vs candidate")
    for column in ("figure", "baseline", "candidate"):
        figures.add_column(column)
    for frow in deploy_report.figure_rows(result):
        figures.add_row(*frow)
    console.print(figures)
    rows = deploy_report.live_rows(result.live)
    if rows:
        live = Table(title="live checks, per patch")
        for column in ("patch", "case", "baseline", "candidate", "candidate answered"):
            live.add_column(column)
        for lrow in rows:
            live.add_row(*lrow)
        console.print(live)
    if result.live is not None:
        if result.live.plan.verified:
            echo(f"verified: {result.live.plan.verified}")
        for note in result.live.plan.notes:
            echo(f"live checks: {note}")
    echo("steps: " + ", ".join(f"{s.name} {s.seconds:.1f}s" for s in result.steps))
    failed = result.failed_check
    echo(f"decision: {result.decision.value}" + (f" ({failed.name} failed)" if failed else ""))
    echo(result.rollback)
    for hook in result.hooks:
        echo(f"after_switch hook failed: {hook}")
    for alarm in result.live.alarms if result.live else []:
        echo(alarm)


probe_app = typer.Typer(cls=_Group, no_args_is_help=True,
                        help="Write a patch's probe, and check it the way `update` does: fail without, pass with.")
app.add_typer(probe_app, name="probe")


@probe_app.command(name="check")
def probe_check(
    patch: Annotated[str, typer.Argument(help="The patch whose probe to check: its number (4) or name.")],
    ref: Annotated[str | None, typer.Option("--ref", help="Upstream ref to check on (default: the pin).")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Run the probe even where a result is cached.")] = False,
) -> None:
    """Run the patch's probe on the pin and on the pin + the series up to and including it.

    Exits 0 only when it fails without the patch and passes with it (what `update` and `status` require).
    """
    from vpatch import probe_check as core
    from vpatch import upstream
    from vpatch.console import ProgressView

    config = _config()
    name, target, patches = core.find_patch(_series(config), config.state_dir, patch)
    if target is None:
        raise VpatchError(f"{name} changes nothing yet",
                          hint="make the change in the applied tree and `git commit --amend -a` it first")
    repo = upstream.open_upstream(config)
    base = upstream.pin_commit(repo, config, moved_ok=True) if ref is None else upstream.resolve(repo, ref)
    with ProgressView() as view:
        checked = core.check(repo, patches, target, base=base, ref=ref or config.pin.ref,
                             use_cache=not no_cache, report=view)
    found = checked.validation
    for side, result in ((f"on {checked.ref} ({base[:12]})", found.base),
                         (f"on {checked.ref} + the series up to {target.name}", found.patched)):
        echo(f"{checked.probe} {side}: {result.outcome.value.upper()}"
             + (" (from the cache)" if result.cached else f" in {result.seconds:.1f}s"))
        for line in (result.detail or "(no output)").splitlines():
            echo(f"    {line}")
    if not found.ok:
        raise VpatchError(found.detail, hint=found.hint or None)
    echo(f"ok: {found.detail}")


@probe_app.command(name="new")
def probe_new(
    patch: Annotated[str, typer.Argument(help="The patch the probe is for: its number (4) or name.")],
    kind: Annotated[str, typer.Option("--kind", help="files: strings each file must (not) hold; "
                                                      "command: a script whose exit code decides.")] = "files",
) -> None:
    """Write probes/NNNN-slug.yaml (and, for a command probe, its script) from a template that follows the probe rules."""
    from vpatch import probe_check as core
    from vpatch.probes import ProbeKind
    from vpatch.series import PROBE

    if kind not in ("files", "command"):
        raise VpatchError(f"--kind must be files or command, not {kind!r}", exit_code=ExitCode.USAGE,
                          hint="vpatch probe new 4 --kind files")
    config = _config()
    name, found, _ = core.find_patch(_series(config), config.state_dir, patch)
    written = core.write_template(config.patches_dir, name, ProbeKind(kind), patch=found)
    for path in written:
        echo(f"wrote {path}")
    trailer = f"{PROBE}: {core.probe_name(name)}"
    if found is not None and found.trailer(PROBE) == core.probe_name(name):
        echo(f"{found.filename} already names it ({trailer})")
    else:
        echo(f"name it in the patch's trailers: {trailer} (in the applied tree: `git commit --amend`, then `vpatch export`)")
    echo(f"edit it, then `vpatch probe check {name[:4]}`: it must fail on the pin and pass with the patch")


def main() -> None:
    try:
        app()
    except Exception as exc:
        if state.debug:
            raise
        echo(f"error: internal error: {type(exc).__name__}: {exc}", err=True)
        echo("hint: rerun with --debug for a traceback, and report it", err=True)
        sys.exit(int(ExitCode.ERROR))
