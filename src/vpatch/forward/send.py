"""`vpatch forward NNNN`: the patch carried onto REF as update would carry it, its own test shown to fail there
without it and pass with it (upstream's pytest, as upstream runs it), upstream's tests of the touched files shown
unbroken, then one commit on a branch in a work tree of REF, its `git format-patch` form and a PR body.

Nothing is written before the evidence holds; nothing in the project's patches/ changes."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from email.utils import parseaddr
from pathlib import Path
from typing import TYPE_CHECKING

from vpatch import git, status, upstream
from vpatch.base import Event, ExitCode, Reporter, VpatchError, atomic_write, run_process
from vpatch.forward.carry import Carry, Way, carry_at
from vpatch.forward.message import Measured, commit_message, pr_body
from vpatch.forward.testfile import UpstreamTest, upstream_test
from vpatch.probes import Regressions, TestRun
from vpatch.series import Patch, Series, slugify

if TYPE_CHECKING:
    from vpatch.config import Config
    from vpatch.probes import Witness

FOLDER = "forward"  # under the project's .vpatch/: one folder per patch number
STATE = "forward.json"  # a stop's record, for --continue


@dataclass(frozen=True)
class Submission:
    """A forwarded patch: where everything is, and the evidence it rests on."""

    patch: str
    carry: Carry
    test: UpstreamTest
    evidence: Measured
    regressions: Regressions
    worktree: Path
    branch: str
    commit: str
    mail: Path  # the commit as `git format-patch` writes it
    body: Path  # the pull request's body (markdown)
    seconds: float = 0.0


@dataclass(frozen=True)
class ForwardStop:
    """The patch conflicts on REF: a person resolves it in the work tree, then `vpatch forward NNNN --continue`."""

    patch: str
    carry: Carry
    ref: str
    commit: str
    worktree: Path
    conflicts: tuple[str, ...] = field(default=())


def forward_patch(config: Config, key: str, *, onto: str | None, evidence: Witness, progress: Reporter) -> Submission | ForwardStop:
    """Forward the series' patch `key` onto `onto` (default: the newest release, or upstream's branch tip in git
    mode). Raises VpatchError, naming the evidence, for a patch update would drop or refuse there."""
    started = time.monotonic()
    series = Series.load(config.patches_dir)
    patch = series.get(key)
    repo = upstream.open_upstream(config)
    pin = upstream.pin_commit(repo, config)
    ref = onto or _default_ref(repo, config)
    commit = upstream.resolve(repo, ref)
    subject = f"forward {patch.name[:4]}"
    progress(Event(subject, "judging", f"what vpatch update --to {ref} would do with it"))
    carry = carry_at(repo, config, series, patch, ref, commit, pin=pin, evidence=evidence, progress=progress)
    if carry.way is Way.REFUSE:
        raise _refusal(patch, carry, ref)
    folder = config.state_dir / FOLDER / patch.name[:4]
    if carry.way is Way.STOP:
        return _stop(repo, folder, patch, carry, ref, commit, progress)
    return _submit(config, repo, folder, patch, carry, ref, commit, evidence, progress, started)


def continue_forward(config: Config, key: str, *, evidence: Witness, progress: Reporter) -> Submission:
    """After a stop: the person's resolution in the work tree (staged) is the carried patch; the rest as usual."""
    started = time.monotonic()
    series = Series.load(config.patches_dir)
    patch = series.get(key)
    folder = config.state_dir / FOLDER / patch.name[:4]
    tree = folder / "tree"
    try:
        state = json.loads((folder / STATE).read_text(encoding="utf-8"))
        ref, commit = str(state["ref"]), str(state["commit"])
    except (OSError, ValueError, KeyError, TypeError):
        raise VpatchError(f"no stopped forward of {patch.filename} to continue",
                          hint=f"vpatch forward {patch.name[:4]} starts one") from None
    repo = upstream.open_upstream(config)
    unresolved = git.unmerged_paths(tree)
    if unresolved:
        raise VpatchError(f"unresolved paths in {tree}: {', '.join(unresolved)}",
                          hint="resolve the conflict markers, `git add` the files, then --continue again")
    git.stage_all(tree)
    diff = git.staged_diff(tree, commit)
    if not diff.strip():
        raise VpatchError(f"the resolution in {tree} changes nothing on {ref}",
                          hint="a patch that changes nothing there has nothing to send")
    resolved = Patch.parse(patch.raw[:len(patch.raw) - len(patch.diff)] + diff, number=patch.number, slug=patch.slug,
                           path=patch.path)
    carry = Carry(Way.CARRY, resolved, "conflict", f"resolved by hand in {tree}")
    git.discard_changes(tree)
    return _submit(config, repo, folder, patch, carry, ref, commit, evidence, progress, started)


def _default_ref(repo: Path, config: Config) -> str:
    if config.upstream.source == "git":
        return config.upstream.branch
    newest = status.newest_release(repo)
    if newest is None:
        raise VpatchError("the release history has no release to forward onto",
                          hint="vpatch releases builds it; or name one: vpatch forward NNNN --onto v0.34.0")
    return newest


def _refusal(patch: Patch, carry: Carry, ref: str) -> VpatchError:
    if carry.refused:
        return VpatchError(f"not forwarding {patch.filename}: vpatch update --to {ref} refuses: {carry.refused}",
                           hint="fix what the update refuses, then forward again")
    landed = f"; Applied-Upstream: {carry.landed_in}" if carry.landed_in else ""
    return VpatchError(f"not forwarding {patch.filename}: it is {carry.case} on {ref}, so update would drop it: "
                       f"{carry.decided_by}{landed}",
                       hint=f"upstream has the change: `vpatch update --to {ref}` drops the patch")


def _fresh_tree(repo: Path, folder: Path, commit: str, branch: str) -> Path:
    """A clone of upstream at folder/tree (its objects borrowed, its branches its own: the shared mirror gains no
    branch), checked out at `commit` on `branch`, whatever an earlier forward of the patch left there."""
    tree = folder / "tree"
    shutil.rmtree(tree, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    git.clone_shared(repo, tree)
    git.checkout_detached(tree, commit)
    git.start_branch(tree, branch)
    return tree


def branch_name(patch: Patch) -> str:
    return f"vpatch/forward/{patch.name}"


def _stop(repo: Path, folder: Path, patch: Patch, carry: Carry, ref: str, commit: str, progress: Reporter) -> ForwardStop:
    progress(Event(f"forward {patch.name[:4]}", "conflict", f"a work tree of {ref} for a person to resolve"))
    tree = _fresh_tree(repo, folder, commit, branch_name(patch))
    git.apply_to_worktree(tree, patch.diff, three_way=True)
    atomic_write(folder / STATE, json.dumps({"patch": patch.filename, "ref": ref, "commit": commit}).encode() + b"\n")
    return ForwardStop(patch.filename, carry, ref, commit, tree, tuple(git.unmerged_paths(tree)))


def _submit(config: Config, repo: Path, folder: Path, patch: Patch, carry: Carry, ref: str, commit: str,
            evidence: Witness, progress: Reporter, started: float) -> Submission:
    carried = carry.patch
    subject = f"forward {patch.name[:4]}"
    test = upstream_test(repo, patch, carried, commit)
    progress(Event(subject, "test", f"{test.path} ({'generated from the probe' if test.generated else 'the probe names it'})"))
    patched = git.tree_with_patch(repo, commit, carried.raw)
    if patched is None:
        raise VpatchError(f"{carried.filename} does not apply on {ref} by itself (update carries it on the patches "
                          "before it)", hint="forward the patches it builds on first, or fold them into it")
    with_test = {test.path: test.content}
    own = evidence.regressions(carried, base=git.tree_with(repo, commit, with_test, ()),
                               patched=git.tree_with(repo, patched, with_test, ()), ref=ref, tests=(test.path,))
    without, with_patch = _outcome(own.base, test.path), _outcome(own.patched, test.path)
    if without != "failed" or with_patch != "passed":
        raise VpatchError(f"{test.path} does not fail on {ref} without {carried.filename} and pass with it: "
                          f"{without} without, {with_patch} with"
                          + "".join(f"\n  {side}: {run.detail}" for side, run in (("without", own.base),
                                                                                   ("with", own.patched)) if run),
                          hint="a test that does not tell the bug from the fix proves nothing to upstream: fix the "
                               "test (or the probe it is made from)")
    found = evidence.regressions(carried, base=commit, patched=patched, ref=ref)
    if found.regressed:
        raise VpatchError(f"{carried.filename} breaks upstream's own tests on {ref}: {', '.join(found.regressed)}",
                          hint="they pass without the change and fail with it: change the patch first")
    tree = _fresh_tree(repo, folder, commit, branch_name(patch))
    if git.apply_to_worktree(tree, carried.diff).returncode != 0:
        raise VpatchError(f"{carried.filename} does not apply in {tree}")  # tree_with_patch said it does
    (tree / test.path).parent.mkdir(parents=True, exist_ok=True)
    (tree / test.path).write_bytes(test.content)
    lint = _lint(evidence, patch, tree, [*(p for p in carried.paths if p.endswith(".py")), test.path])
    facts = Measured(ref, commit, without, with_patch, found.says(), found.tests, lint)
    git.stage_all(tree)
    sha = git.commit_index(tree, commit_message(patch, carry, test, facts), author=_author(patch))
    mail = folder / f"0001-{slugify(patch.subject)}.patch"
    for old in folder.glob("0001-*.patch"):
        old.unlink()
    atomic_write(mail, git.format_patch(tree, sha))
    body = folder / "pr-body.md"
    atomic_write(body, pr_body(patch, carry, test, facts).encode())
    (folder / STATE).unlink(missing_ok=True)
    progress(Event(subject, "done", f"{branch_name(patch)} at {sha[:12]}", final=True,
                   seconds=time.monotonic() - started))
    return Submission(patch.filename, carry, test, facts, found, tree, branch_name(patch), sha, mail, body,
                      round(time.monotonic() - started, 1))


def _outcome(run: TestRun | None, test: str) -> str:
    """The test file's outcome in one pytest run: failed when any of its tests failed or errored, passed when all
    passed, else what happened (skipped, not collected)."""
    if run is None or not run.ran:
        return "not run"
    mine = [s for node, s in run.results if node.split("::", 1)[0] == test]
    if not mine:
        return "not collected"
    if any(s in ("failed", "error") for s in mine):
        return "failed"
    return "passed" if all(s == "passed" for s in mine) else "skipped"


def _lint(evidence: Witness, patch: Patch, tree: Path, files: list[str]) -> str:
    """ruff with upstream's own configuration (its pyproject, found from the tree) on the changed files, where the
    probe venv has ruff; vpatch installs nothing for it."""
    ruff = evidence.venv_tool(patch, "ruff")
    if ruff is None:
        return "not checked: ruff absent from the probe venv"
    ran = run_process([str(ruff), "check", "--no-cache", *files], cwd=tree, check=False, merge_output=True)
    out = ran.stdout.decode("utf-8", "replace").strip()
    if ran.returncode != 0:
        raise VpatchError(f"ruff (upstream's configuration) finds problems in the changed files:\n{out}",
                          hint=f"fix them in the patch or its test; the work tree is {tree}",
                          exit_code=ExitCode.ERROR)
    return f"ruff with upstream's configuration: clean ({len(files)} file(s))"


def _author(patch: Patch) -> git.Identity:
    name, email = parseaddr(patch.author)
    return git.Identity(name or "vpatch", email or "vpatch@localhost", patch.date or "1970-01-01T00:00:00+0000")

