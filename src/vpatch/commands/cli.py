"""The command line: the typer app, the global options, errors as exit codes; each command's body is in
`vpatch.commands.<cmd>`, imported when the command runs (so `--help` loads none of them)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from vpatch.base import ExitCode, VpatchError, exit_code_help
from vpatch.commands import echo
from vpatch.config import Strategy


class _Group(TyperGroup):
    """Turns VpatchError into 'error:'/'hint:' lines and its exit code, for the CLI and CliRunner alike."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except VpatchError as exc:
            if state.debug:
                import traceback  # lazy: only with --debug

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
        from importlib.metadata import version  # lazy: only for --version

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


def _exit(code: int) -> None:
    """A command's exit code as the process's (typer.Exit, so CliRunner sees it too)."""
    if code:
        raise typer.Exit(int(code))


@app.command()
def fetch(
    blob_filter: Annotated[str | None, typer.Option("--filter", help="blob:none: a partial mirror (every commit and "
                                                    "tree; file contents fetched when first read).")] = None,
) -> None:
    """Create or update the upstream mirror (a bare git repository in the cache); git's progress on stderr."""
    from vpatch.commands import fetch  # lazy: a command's module loads only when it runs, so --help stays light

    _exit(fetch.run(project=state.project, blob_filter=blob_filter))


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
    from vpatch.commands import releases  # lazy: a command's module loads only when it runs, so --help stays light

    _exit(releases.run(project=state.project, versions=versions or [], first=first, last=last, pre=pre,
                       list_only=list_only))


@app.command(name="lock-probes")
def lock_probes(
    lock: Annotated[Path | None, typer.Option("--lock", help="The lock file (default: probes/requirements.lock "
                                                 "in the patches folder).")] = None,
) -> None:
    """Refresh the probe venv's lock on purpose: resolve its '# requires:' line afresh, leave out '# omit:'.

    Every probe that uses the lock gets a new venv and new verdicts (the lock is part of both keys).
    Commit the changed lock with the reason for the refresh.
    """
    from vpatch.commands import lock_probes  # lazy: a command's module loads only when it runs, so --help stays light

    _exit(lock_probes.run(project=state.project, lock=lock))


@app.command()
def apply(
    ref: Annotated[str | None, typer.Option("--ref", help="Upstream ref to apply onto (default: the pin).")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Folder for the work tree (default: .vpatch/tree).")] = None,
    keep: Annotated[bool, typer.Option(
        "--keep", help="On failure keep the tree with the patches before the failing one, to fix it.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing tree even if it holds work not yet exported.")] = False,
) -> None:
    """Materialise a work tree of the pin (or REF) with each patch committed as one commit."""
    from vpatch.commands import apply  # lazy: a command's module loads only when it runs, so --help stays light

    _exit(apply.run(project=state.project, ref=ref, out=out, keep=keep, force=force))


@app.command()
def export(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would change; write nothing.")] = False,
    force: Annotated[bool, typer.Option(
        "--force", help="Overwrite patch files changed since vpatch last wrote them (hand edits are lost).")] = False,
) -> None:
    """Write the commits of the applied tree back to the numbered patch files."""
    from vpatch.commands import export  # lazy: a command's module loads only when it runs, so --help stays light

    _exit(export.run(project=state.project, dry_run=dry_run, force=force))


@app.command()
def new(
    slug: Annotated[str, typer.Argument(help="Short name of the patch, e.g. fix-parser (lower case, dashes).")],
    subject: Annotated[str | None, typer.Option("--subject", help="First line of the patch message.")] = None,
) -> None:
    """Start a new patch: an empty commit with the header template in the applied tree."""
    from vpatch.commands import new  # lazy: a command's module loads only when it runs, so --help stays light

    _exit(new.run(project=state.project, slug=slug, subject=subject))


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
    from vpatch.commands import build  # lazy: a command's module loads only when it runs, so --help stays light

    _exit(build.run(project=state.project, name=name, plan=plan, push=push, strategy=strategy, base=base))


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
    from vpatch.commands import verify  # lazy: a command's module loads only when it runs, so --help stays light

    _exit(verify.run(project=state.project, image=image, probes=probes, live=live, definition=definition))


@app.command()
def serve(
    name: Annotated[str, typer.Argument(help="Image definition whose serve: section to run: images/NAME.yaml.")],
    print_only: Annotated[bool, typer.Option(
        "--print", help="Print the exact `docker run` (shell-quoted) and the restart policy given once alive; start nothing.")] = False,
    diff: Annotated[bool, typer.Option("--diff", help="Compare the running container with the yaml; exit 7 on drift.")] = False,
    image: Annotated[str | None, typer.Option("--image", help="Run this image instead of the definition's moving tag.")] = None,
    replace: Annotated[bool, typer.Option("--replace", help="Replace a container of the same name (after the lint passed).")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="With --diff: one JSON document.")] = False,
    check: Annotated[bool, typer.Option(
        "--check", help="Is the running server alive (the container health check's rule)? Exit 0 alive, 1 not.")] = False,
    host: Annotated[str | None, typer.Option(
        "--host", help="Only this host of images/NAME.yaml's hosts: (default: every host, the standby first).")] = None,
) -> None:
    """Start the server as images/NAME.yaml's serve: section says: lint it against the image, run it, wait for /health.

    It starts with restart policy no and gets the yaml's once alive: a server that dies at start is not restarted.
    --print shows the exact `docker run` that would run; --diff shows how the running container differs.
    """
    from vpatch.commands import serve  # lazy: a command's module loads only when it runs, so --help stays light

    _exit(serve.run(project=state.project, name=name, print_only=print_only, diff=diff, image=image, replace=replace,
                    json_out=json_out, check=check, host=host))


@app.command()
def status(
    against: Annotated[list[str] | None, typer.Option(
        "--against", help="Upstream ref to judge on; repeat it for several. Default: the newest release and, "
        "with a git upstream, the branch tip. The pin is always a column.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document (for CI) instead of the table.")] = False,
    exit_code: Annotated[bool, typer.Option(
        "--exit-code", help=exit_code_help(ExitCode.LANDED, ExitCode.ATTENTION, scope="`status --exit-code`: "))] = False,
    no_probes: Annotated[bool, typer.Option("--no-probes", help="Textual evidence only: run no probe.")] = False,
    jobs: Annotated[int | None, typer.Option(
        "--jobs", "-j", min=1, help="Probe runs at once (default: the cores this process may use).")] = None,
) -> None:
    """Which patches upstream has (with the evidence), since which commit and release, and which still need you."""
    from vpatch.commands import status  # lazy: a command's module loads only when it runs, so --help stays light

    _exit(status.run(project=state.project, against=against or [], json_out=json_out, exit_code=exit_code,
                     no_probes=no_probes, jobs=jobs))


@app.command()
def forward(
    patch: Annotated[str, typer.Argument(help="The patch: its number (3, 0003) or name.")],
    onto: Annotated[str | None, typer.Option("--onto", help="Upstream ref to forward onto (default: the newest "
                                                            "release, or upstream's branch tip with a git upstream).")] = None,
    record: Annotated[str | None, typer.Option("--record", help="Write where it was sent into its header: "
                                                                "Forwarded: URL (and Upstream-PR: N for a GitHub pull URL).")] = None,
    continue_: Annotated[bool, typer.Option("--continue", help="Go on after resolving a conflict in its work tree.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as one JSON document.")] = False,
    jobs: Annotated[int | None, typer.Option(
        "--jobs", "-j", min=1, help="Probe runs at once (default: the cores this process may use).")] = None,
) -> None:
    """Send a needed patch upstream: one commit on REF with a test that fails without it and passes with it."""
    from vpatch.commands import forward  # lazy: a command's module loads only when it runs, so --help stays light

    _exit(forward.run(project=state.project, patch=patch, onto=onto, record=record, continue_=continue_,
                      json_out=json_out, jobs=jobs))


@app.command()
def update(
    to: Annotated[str | None, typer.Option("--to", help="Upstream ref to move the pin to, e.g. v0.31.0.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan (verdicts and actions); change nothing.")] = False,
    no_commit: Annotated[bool, typer.Option("--no-commit", help="Stage the change in the project; do not commit it.")] = False,
    allow_downgrade: Annotated[bool, typer.Option("--allow-downgrade", help="Allow a REF that does not descend from the pin.")] = False,
    no_narrow: Annotated[bool, typer.Option("--no-narrow", help="Stop at a partial or conflicting patch, never narrow.")] = False,
    furthest: Annotated[bool, typer.Option(
        "--furthest", help="With --to: go only as far as the series allows without a person (the newest release, or "
                           "first-parent commit, at or before it where the update succeeds); name what blocks the "
                           "next step. Exit 9: moved, a patch blocks going further.")] = False,
    continue_: Annotated[bool, typer.Option("--continue", help="Go on after resolving the conflict in the update tree.")] = False,
    abort: Annotated[bool, typer.Option("--abort", help="Throw the stopped update away; the project is as before it.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as one JSON document (for CI).")] = False,
    jobs: Annotated[int | None, typer.Option(
        "--jobs", "-j", min=1, help="Probe runs at once (default: the cores this process may use).")] = None,
) -> None:
    """Move the pin: drop the patches upstream has (with evidence), refresh the rest, one commit; or stop on a conflict."""
    from vpatch.commands import update  # lazy: a command's module loads only when it runs, so --help stays light

    _exit(update.run(project=state.project, to=to, dry_run=dry_run, no_commit=no_commit,
                     allow_downgrade=allow_downgrade, no_narrow=no_narrow, furthest=furthest, continue_=continue_,
                     abort=abort, json_out=json_out, jobs=jobs))


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
    keep: Annotated[int | None, typer.Option("--keep", min=0, help="With --prune: keep the N newest of each kind (1).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="The report as JSON on stdout.")] = False,
    report: Annotated[bool, typer.Option(
        "--report", help="Render the last deploy's HTML report again from its record (also after a kill).")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="With --report: write the page here.")] = None,
    baseline: Annotated[str, typer.Option(
        "--baseline", help="recorded: the figures recorded when the running image was deployed (measured when "
        "there are none); measure: run the checks against production now; none: no baseline.")] = "recorded",
    host: Annotated[str | None, typer.Option(
        "--host", help="Only this host of images/NAME.yaml's hosts: (default: every host, the standby first).")] = None,
) -> None:
    """Switch production to a new image with checks; roll back by itself when one fails (exit 6)."""
    from vpatch.commands import deploy  # lazy: a command's module loads only when it runs, so --help stays light

    _exit(deploy.run(project=state.project, name=name, image=image, rollback=rollback, where=where, prune=prune,
                     keep=keep, as_json=as_json, report=report, out=out, baseline=baseline, host=host))


probe_app = typer.Typer(cls=_Group, no_args_is_help=True,
                        help="Write a patch's probe, and check it the way `update` does: fail without, pass with.")
app.add_typer(probe_app, name="probe")


@probe_app.command(name="check")
def probe_check(
    patch: Annotated[str, typer.Argument(help="The patch whose probe to check: its number (4) or name.")],
    ref: Annotated[str | None, typer.Option("--ref", help="Upstream ref to check on (default: the pin).")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Run the probe even where a result is cached.")] = False,
    jobs: Annotated[int | None, typer.Option(
        "--jobs", "-j", min=1, help="Probe runs at once (default: the cores this process may use).")] = None,
    no_hunks: Annotated[bool, typer.Option(
        "--no-hunks", help="Skip the per-hunk coverage (the probe once without each hunk).")] = False,
    no_upstream_tests: Annotated[bool, typer.Option(
        "--no-upstream-tests", help="Skip upstream's own tests of the touched files (regression evidence).")] = False,
) -> None:
    """Run the patch's probe on the pin and on the pin + the series up to and including it.

    Then says which hunks the probe proves (each taken out alone) and runs upstream's own tests of the files
    the patch touches without and with it. Exits 0 only when the probe fails without the patch and passes with
    it (what `update` and `status` require) and no upstream test that passes without the patch fails with it.
    """
    from vpatch.commands import probe  # lazy: a command's module loads only when it runs, so --help stays light

    _exit(probe.check(project=state.project, patch=patch, ref=ref, no_cache=no_cache, jobs=jobs,
                      hunks=not no_hunks, upstream_tests=not no_upstream_tests))


@probe_app.command(name="new")
def probe_new(
    patch: Annotated[str, typer.Argument(help="The patch the probe is for: its number (4) or name.")],
    kind: Annotated[str, typer.Option("--kind", help="files: strings each file must (not) hold; "
                                                      "command: a script whose exit code decides.")] = "files",
) -> None:
    """Write probes/NNNN-slug.yaml (and, for a command probe, its script) from a template that follows the probe rules."""
    from vpatch.commands import probe  # lazy: a command's module loads only when it runs, so --help stays light

    _exit(probe.new(project=state.project, patch=patch, kind=kind))


def main() -> None:
    try:
        app()
    except Exception as exc:
        if state.debug:
            raise
        echo(f"error: internal error: {type(exc).__name__}: {exc}", err=True)
        echo("hint: rerun with --debug for a traceback, and report it", err=True)
        sys.exit(int(ExitCode.ERROR))
