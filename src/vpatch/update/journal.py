"""The update's state on disk: where it works, the stop state for --continue/--abort, the commit journal.

Everything lives in `.git/vpatch-update/` of the project's repository, so a kill leaves either nothing
the next run cannot clear, a stop state (like git's rebase state), or a commit journal.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vpatch import git
from vpatch.errors import VpatchError
from vpatch.fs import atomic_write
from vpatch.update.plan import Plan

if TYPE_CHECKING:
    from vpatch.config import Config

WORK_DIR = "vpatch-update"
STATE_FILE = "state.json"
JOURNAL_FILE = "commit.json"
KILL_ENV = "VPATCH_TEST_KILL_AT"
# Every point where the interrupt tests kill the process, in the order an update reaches them.
STEPS = ("resolved", "judged", "applied", "validated", "exported", "prepared", "committed")


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
class State:
    plan: Plan
    head: str  # the project's HEAD when the update started
    head_ref: str
    repo: str  # the upstream repository
    no_commit: bool
    pending: list[str]  # kept patches not yet committed in the update tree (the first one stopped)
    resolved: list[str] = field(default_factory=list)  # patches a person resolved (--continue)

    def to_json(self) -> str:
        data = {**asdict(self), "plan": self.plan.to_dict()}
        return json.dumps(data, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> State:
        data = json.loads(text)
        return cls(**{**data, "plan": Plan.from_dict(data["plan"])})


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
        state = load_state(project)
        raise VpatchError(f"an update to {state.plan.to_ref} is in progress, stopped at {state.pending[0]}",
                          hint=f"resolve it in {project.tree}, then vpatch update --continue; or vpatch update --abort")


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


def save_state(project: Project, state: State) -> None:
    atomic_write(project.work / STATE_FILE, state.to_json().encode())


def load_state(project: Project) -> State:
    path = project.work / STATE_FILE
    if not path.is_file():
        raise VpatchError("no update in progress", hint="vpatch update --to REF starts one")
    try:
        return State.from_json(path.read_text())
    except (ValueError, KeyError, TypeError) as exc:
        raise _unreadable(path, exc) from None


def read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise _unreadable(path, exc) from None
    if not isinstance(data, dict):
        raise _unreadable(path, TypeError("not a JSON object"))
    return data


def write_journal(project: Project, journal: dict[str, Any]) -> None:
    atomic_write(project.work / JOURNAL_FILE, (json.dumps(journal, indent=2) + "\n").encode())


def _unreadable(path: Path, exc: Exception) -> VpatchError:
    if path.name == JOURNAL_FILE:
        return VpatchError(f"the commit journal of an interrupted update is unreadable ({path}: {exc})",
                           hint="check `git log -1` and `git status`: if the update's commit is there, keep or reset "
                                f"it by hand; then delete {path.parent}")
    return VpatchError(f"the state of the stopped update is unreadable ({path}: {exc})",
                       hint="vpatch update --abort discards the stopped update (the project itself is untouched)")


def checkpoint(step: str) -> None:
    """Test hook: VPATCH_TEST_KILL_AT=<step> kills the process here, as a power cut or `kill -9` would."""
    if os.environ.get(KILL_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)


