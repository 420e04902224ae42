"""The update's state on disk: where it works, the stop state for --continue/--abort, the commit journal.

Everything lives in `.git/vpatch-update/` of the project's repository, so a kill leaves either nothing
the next run cannot clear, a stop state (like git's rebase state), or a commit journal.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vpatch import git
from vpatch.base import VpatchError, load_record, save_record
from vpatch.update.plan import UpdatePlan

if TYPE_CHECKING:
    from vpatch.config import Config

WORK_DIR = "vpatch-update"
STATE_FILE = "state.json"
JOURNAL_FILE = "commit.json"


@dataclass(frozen=True)
class Project:
    """The project's place in its git repository."""

    config: Config
    top: Path  # the repository's work tree root
    git_dir: Path
    rel: str  # the project folder relative to `top` ("" when it is the root)

    @property
    def work(self) -> Path:
        return self.git_dir / WORK_DIR

    @property
    def tree(self) -> Path:
        return self.work / "tree"

    def path(self, name: str) -> str:
        return f"{self.rel}/{name}" if self.rel else name

    @classmethod
    def open(cls, config: Config) -> Project:
        top = git.toplevel(config.root)
        if top is None:
            raise VpatchError(f"{config.root} is not in a git repository",
                              hint="vpatch update commits its change; run `git init` and commit the project first")
        rel = config.root.resolve().relative_to(top.resolve()).as_posix()
        return cls(config, top, git.git_dir(top), "" if rel == "." else rel)


@dataclass(frozen=True)
class UpdateState:
    plan: UpdatePlan
    head: str  # the project's HEAD when the update started
    head_ref: str
    repo: str  # the upstream repository
    no_commit: bool
    pending: list[str]  # kept patches not yet committed in the update tree (the first one stopped)
    resolved: list[str] = field(default_factory=list)  # patches a person resolved (--continue)
    why: str = ""  # why it stopped at pending[0], in a few words ("conflict in vllm/parser/qwen3.py")
    started: str = ""  # the project's HEAD when the update started ("": `head`); `head` moves when a
    # commit made during the stop is taken in (as `git rebase` takes a commit made mid-rebase)
    taken_in: list[str] = field(default_factory=list)  # those commits, oldest first
    left: str = ""  # sha256 of the update tree's diff as the stop left it: unchanged, there is nothing to keep
    replayed: list[str] = field(default_factory=list)  # patches whose kept resolution a stop replayed (and
    # nothing replaced since): their kept copy goes once the update's commit holds it
    edited: str = ""  # sha256 of the diff of the stopped patch as edited by hand in patches/ and taken in (its
    # header is always the file's: an edit of the header alone never replaces the tree's resolution)

    @property
    def start(self) -> str:
        return self.started or self.head

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "plan": self.plan.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UpdateState:
        return cls(**{**data, "plan": UpdatePlan.from_dict(data["plan"])})


@dataclass(frozen=True)
class CommitJournal:
    """The commit point, written before it: the branch `ref` moves from `old` to `new` (the update's commit)."""

    ref: str
    old: str
    new: str
    repo: str  # the upstream repository, whose update tree goes once the commit is finished or undone
    plan: UpdatePlan
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"ref": self.ref, "old": self.old, "new": self.new, "repo": self.repo, "plan": self.plan.to_dict(),
                "message": self.message}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CommitJournal:
        for name in ("ref", "old", "new", "repo", "message"):
            if not isinstance(data.get(name), str):
                raise TypeError(f"its {name!r} is missing or not a string")
        return cls(**{**data, "plan": UpdatePlan.from_dict(data["plan"])})


@dataclass(frozen=True)
class Stopped:
    """A stopped (or half-committed) update, as every command shows it."""

    to_ref: str
    file: str  # the patch it stopped at ("": none left to resolve, or interrupted while committing)
    why: str
    tree: Path
    committing: bool = False  # interrupted at its commit point (the journal)

    def line(self) -> str:
        if self.committing:
            return (f"update to {self.to_ref} was interrupted while committing: `vpatch update --continue` finishes "
                    "it (or `--abort` undoes it)")
        if not self.file:
            return (f"update to {self.to_ref} was interrupted during `--continue`, its stops resolved: "
                    "`vpatch update --continue` finishes it (or `--abort`)")
        return (f"update to {self.to_ref} stopped at {self.file} ({self.why}): resolve in {self.tree}, then "
                "`vpatch update --continue` (or `--abort`)")

    def to_json(self) -> dict[str, str | bool]:
        return {"to": self.to_ref, "file": self.file, "why": self.why, "tree": str(self.tree),
                "committing": self.committing, "line": self.line()}


def stopped_update(config: Config) -> Stopped | None:
    """The update this project is in the middle of, or None; never raises for a project outside git or a
    state that does not load (the update's own commands say what is wrong with it)."""
    if git.toplevel(config.root) is None:
        return None
    project = Project.open(config)
    try:
        journal = load_journal(project)
        if journal is not None:
            return Stopped(journal.plan.to_ref, "", "", project.tree, committing=True)
        if not (project.work / STATE_FILE).exists():
            return None
        state = load_state(project)
    except VpatchError:
        return None
    file = state.pending[0] if state.pending else ""
    row = next((p for p in state.plan.patches if p.file == file), None)
    why = state.why or (row.state if row is not None else "stopped")
    return Stopped(state.plan.to_ref, file, why, project.tree)


def refuse_dirty(project: Project) -> None:
    dirty = git.dirty_paths(project.top, [project.path(project.config.patches), project.path("vpatch.yaml")])
    if dirty:
        shown = ", ".join(dirty[:5]) + (" ..." if len(dirty) > 5 else "")
        raise VpatchError(f"uncommitted changes in the series or the pin: {shown}",
                          hint="commit or discard them first: vpatch update makes one commit of its own")


def refuse_in_progress(project: Project) -> None:
    if (project.work / JOURNAL_FILE).exists():
        raise VpatchError("an update was interrupted while committing",
                          hint="vpatch update --continue finishes it; vpatch update --abort undoes it")
    if (project.work / STATE_FILE).exists():
        load_state(project)  # a state that does not load says so, and what to do
        stopped = stopped_update(project.config)
        raise VpatchError("an update is in progress: " + (stopped.line() if stopped else "its state does not load"),
                          hint="finish it first: `vpatch update --continue` (or `--abort`, which keeps your resolution)")


def clear_stale(project: Project, repo: Path) -> None:
    """Leftovers of a killed run (no state file): nothing anyone can continue, so remove them."""
    discard(project, repo)  # also when the folder is gone but the mirror still registers a tree in it


def discard(project: Project, repo: Path) -> None:
    """Remove the update tree, its registration in the mirror, and the update's state; the commit journal
    goes last, so that a kill half-way through leaves it for --continue / --abort."""
    # Deleting the files first and pruning the registration after is several times faster than
    # `git worktree remove` on vLLM's tree, and equally final.
    journal = project.work / JOURNAL_FILE
    if project.work.is_dir():
        for entry in project.work.iterdir():
            if entry != journal:
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    git.forget_worktrees(repo, project.work)
    journal.unlink(missing_ok=True)
    shutil.rmtree(project.work, ignore_errors=True)


def save_state(project: Project, state: UpdateState) -> None:
    save_record(project.work / STATE_FILE, state)


def load_state(project: Project) -> UpdateState:
    state = load_record(project.work / STATE_FILE, UpdateState.from_dict, what="the state of the stopped update",
                         hint="vpatch update --abort discards the stopped update (the project itself is untouched)")
    if state is None:
        raise VpatchError("no update in progress", hint="vpatch update --to REF starts one")
    return state


def save_journal(project: Project, journal: CommitJournal) -> None:
    save_record(project.work / JOURNAL_FILE, journal)


def load_journal(project: Project) -> CommitJournal | None:
    """The commit journal of an update interrupted at its commit point, or None when there is none."""
    return load_record(project.work / JOURNAL_FILE, CommitJournal.from_dict,
                        what="the commit journal of an interrupted update",
                        hint="check `git log -1` and `git status`: if the update's commit is there, keep or reset it "
                             f"by hand; then delete {project.work}")
