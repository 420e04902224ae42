"""The toy project's commit, a new upstream release, and everything a user could notice about the project."""

from __future__ import annotations

from conftest import Project, git, snapshot
from conftest import vpatch_cli as run


def state_of(project: Project) -> dict[str, object]:
    """Everything a user could notice about the project: files, HEAD, index, status."""
    return {
        "files": {k: v for k, v in snapshot(project.root).items() if not k.startswith(".git/")},
        "head": git(project.root, "rev-parse", "HEAD"),
        "index": git(project.root, "ls-files", "-s"),
        "status": git(project.root, "status", "--porcelain", "--untracked-files=all"),
    }


def commit_all(project: Project, message: str = "project") -> str:
    """Commit everything in the project (its repository made on the first call); returns the new HEAD."""
    if not (project.root / ".git").exists():
        git(project.root, "init", "-q", "-b", "main")
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", message)
    return git(project.root, "rev-parse", "HEAD").strip()


def release(project: Project, files: dict[str, str | None], tag: str) -> None:
    """A new upstream release `tag` with `files` changed, fetched into the project's mirror."""
    project.upstream.commit(files, tag, tag=tag)
    assert run(project, "fetch")[0] == 0
