"""kill -9 at every git command `update`, `apply` and `export` run: the project is as before, or finishable and undoable.

A wrapper first on PATH (gitkill.sh) counts the git commands of one vpatch process and kills that process at
the N-th, before the command runs or just after it completed. A first, unkilled run counts the commands.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import KV_FIXED, PARSER_FIXED, PARSER_V1, Project, git
from conftest import vpatch_cli as cli
from helpers.project import commit_all, release, state_of
from typer.testing import CliRunner

from vpatch.base.paths import cache_dir
from vpatch.commands.cli import app
from vpatch.config.project import Config
from vpatch.upstream import commitcache

GITKILL = Path(__file__).parents[1] / "helpers" / "gitkill.sh"


@dataclass(frozen=True)
class Ran:
    returncode: int
    output: str


@dataclass
class Killer:
    """Runs vpatch in a child process whose `git` is the counting, killing wrapper."""

    project: Project
    bindir: Path
    counter: Path

    def env(self, at: int, mode: str, extra: dict[str, str]) -> dict[str, str]:
        return {"PATH": f"{self.bindir}{os.pathsep}{os.environ['PATH']}", "VPATCH_GITKILL_COUNTER": str(self.counter),
                "VPATCH_GITKILL_AT": str(at), "VPATCH_GITKILL_MODE": mode,
                "VPATCH_REAL_GIT": str(shutil.which("git")), **extra}

    def start(self, *args: str, at: int = 0, mode: str = "before", kill_at_write: int = 0, **extra: str) -> int:
        """vpatch in a forked child (no interpreter start-up per run); the wrapper kills that child.
        `kill_at_write`: the child kills itself just after its n-th file write (export's writes run no git)."""
        self.counter.write_text("0")
        out = self.counter.with_suffix(".out")
        out.unlink(missing_ok=True)
        env = self.env(at, mode, extra)
        # Each run starts from an empty commit cache, so it makes the git commands the counting run made.
        shutil.rmtree(cache_dir() / "commit-facts", ignore_errors=True)
        commitcache.reset()
        pid = os.fork()
        if pid == 0:  # the child: run the command, report its output through a file, never return to pytest
            code = 1
            try:
                os.environ.update(env)
                if kill_at_write:
                    _die_at_write(kill_at_write)
                result = CliRunner().invoke(app, ["--project", str(self.project.root), *args])
                out.write_text(result.output)
                code = result.exit_code
            finally:
                os._exit(code)
        return pid

    def wait(self, pid: int) -> Ran:
        _, status = os.waitpid(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        out = self.counter.with_suffix(".out")
        return Ran(code, out.read_text() if out.exists() else "")

    def run(self, *args: str, at: int = 0, mode: str = "before", kill_at_write: int = 0, **extra: str) -> Ran:
        return self.wait(self.start(*args, at=at, mode=mode, kill_at_write=kill_at_write, **extra))

    def count(self, *args: str) -> int:
        """How many git commands an unkilled run makes (and that it succeeds)."""
        proc = self.run(*args)
        assert proc.returncode == 0, proc.output
        return int(self.counter.read_text())


def _die_at_write(n: int) -> None:
    """In a forked child only: SIGKILL this process right after its n-th atomic file write (export's: the tree's
    record, then the series files)."""
    from vpatch.base import fs, records
    from vpatch.tree import export

    real, count = fs.atomic_write, [0]

    def write(path: Path, data: bytes, **kwargs: bool) -> None:
        real(path, data, **kwargs)
        count[0] += 1
        if count[0] == n:
            os.kill(os.getpid(), signal.SIGKILL)

    records.atomic_write = write  # type: ignore[assignment]
    export.atomic_write = write  # type: ignore[assignment]


@pytest.fixture
def killer(project: Project, tmp_path: Path) -> Killer:
    bindir = tmp_path / "gitkill-bin"
    bindir.mkdir()
    (bindir / "git").symlink_to(GITKILL)
    return Killer(project, bindir, tmp_path / "gitkill-count")


@pytest.fixture
def two(project: Project) -> Project:
    """0001 (lands in v1.1, dropped) and 0002 (re-applied with offsets) in the project's own repository;
    v1.1 released upstream."""
    project.make_patch(1, "kv-skip-null", {"vllm/kv.py": KV_FIXED}, "Skip null blocks")
    project.make_patch(2, "parser-fix", {"vllm/parser.py": PARSER_FIXED}, "Fix the parser")
    commit_all(project)
    release(project, {"vllm/kv.py": KV_FIXED, "vllm/parser.py": "# header\n" * 5 + PARSER_V1}, "v1.1")
    return project


def reset(project: Project, head: str) -> None:
    git(project.root, "reset", "-q", "--hard", head)
    git(project.root, "clean", "-qfdx", "-e", ".vpatch")


def assert_updated(project: Project, out: str = "") -> None:
    assert Config.load(project.root).pin.ref == "v1.1", out
    assert not (project.patches / "0001-kv-skip-null.patch").exists()
    assert git(project.root, "status", "--porcelain") == "", out
    assert git(project.root, "log", "-1", "--format=%s").startswith("Update upstream pin v1.0 -> v1.1")
    assert git(project.root, "rev-list", "--count", "HEAD") == "2\n"


def in_progress(project: Project) -> bool:
    work = project.root / ".git" / "vpatch-update"
    return (work / "commit.json").exists() or (work / "state.json").exists()


# Commands that change something; a kill just after a read-only command is the same as a kill before the next.
WRITES = ("worktree", "apply", "commit", "hash-object", "update-index", "commit-tree", "update-ref", "read-tree",
          "write-tree", "reset", "add")


def check_killed_update(two: Project, killer: Killer, before: dict[str, object], head: str, n: int, mode: str) -> bool:
    """After a kill at the n-th git command: as before, or finishable and undoable; then a new update works.
    Returns whether the kill left an update to finish."""
    proc = killer.run("update", "--to", "v1.1", at=n, mode=mode)
    assert proc.returncode == -9, (n, proc.output)
    finishable = in_progress(two)
    if not finishable:
        assert state_of(two) == before, n
    else:
        code, out = cli(two, "update", "--continue")
        assert code == 0, (n, out)
        assert_updated(two, out)
        reset(two, head)
        assert killer.run("update", "--to", "v1.1", at=n, mode=mode).returncode == -9
        code, out = cli(two, "update", "--abort")
        assert code == 0, (n, out)
        assert state_of(two) == before, n
    # whatever the kill left behind, a new update runs through (a kill that left nothing at all, in the
    # judging before any write, needs no second look: the project and vpatch's folders are as at the start)
    if finishable or (two.root / ".git" / "vpatch-update").exists() or "vpatch-update" in git(
            mirror_of(two), "worktree", "list", "--porcelain"):
        code, out = cli(two, "update", "--to", "v1.1")
        assert code == 0, (n, out)
        assert_updated(two, out)
        reset(two, head)
    return finishable


def test_update_killed_at_every_git_command_is_undone_or_finishable(two: Project, killer: Killer, tmp_path: Path) -> None:
    before = state_of(two)
    head = git(two.root, "rev-parse", "HEAD").strip()
    calls = git_calls(killer, tmp_path, "update", "--to", "v1.1")
    assert_updated(two)
    reset(two, head)
    assert len(calls) > 30 and any(c.startswith("update-ref") for c in calls)
    kills = [(n, "before") for n in range(1, len(calls) + 1)]
    kills += [(n, "after") for n, c in enumerate(calls, 1) if c.split()[0] in WRITES]
    finishable = [n for n, mode in kills if check_killed_update(two, killer, before, head, n, mode)]
    # every kill from the journal write on (the update-ref at the commit point, and after it) is finishable
    commit_point = next(n for n, c in enumerate(calls, 1) if c.startswith("update-ref"))
    assert commit_point in finishable and len(calls) in finishable


def mirror_of(project: Project) -> Path:
    from vpatch.base.paths import cache_dir
    from vpatch.upstream.mirror import mirror_path

    return mirror_path(cache_dir(), project.upstream.url)


def git_calls(killer: Killer, tmp_path: Path, *args: str) -> list[str]:
    """The git commands of one unkilled run, in order."""
    log = tmp_path / "git.log"
    log.unlink(missing_ok=True)
    os.environ["VPATCH_GITKILL_LOG"] = str(log)
    try:
        killer.count(*args)
    finally:
        del os.environ["VPATCH_GITKILL_LOG"]
    calls = []
    for line in log.read_text().splitlines():
        words = line.split(" ")[1:]
        while words[:1] == ["-c"]:
            words = words[2:]  # vpatch's fixed config options
        calls.append(" ".join(words))
    return calls


def test_update_killed_inside_worktree_add_does_not_block_later_updates(two: Project, killer: Killer, tmp_path: Path) -> None:
    head = git(two.root, "rev-parse", "HEAD").strip()
    before = state_of(two)
    calls = git_calls(killer, tmp_path, "update", "--to", "v1.1")
    reset(two, head)
    add = next(n for n, c in enumerate(calls, 1) if " worktree add " in f" {c} ")
    assert killer.run("update", "--to", "v1.1", at=add, mode="locked").returncode == -9
    assert "locked initializing" in git(mirror_of(two), "worktree", "list", "--porcelain")
    assert state_of(two) == before
    code, out = cli(two, "update", "--abort")
    assert code == 1 and "no update in progress" in out
    code, out = cli(two, "update", "--to", "v1.1")
    assert code == 0, out
    assert_updated(two, out)
    assert "vpatch-update" not in git(mirror_of(two), "worktree", "list")


def commit_point(killer: Killer, tmp_path: Path, two: Project) -> int:
    """The number of the git command that moves the branch (update-ref), counted on an unkilled run."""
    head = git(two.root, "rev-parse", "HEAD").strip()
    calls = git_calls(killer, tmp_path, "update", "--to", "v1.1")
    reset(two, head)
    return next(n for n, c in enumerate(calls, 1) if c.startswith("update-ref"))


def test_continue_after_a_kill_just_before_the_branch_moves_makes_the_commit(two: Project, killer: Killer, tmp_path: Path) -> None:
    at = commit_point(killer, tmp_path, two)
    head = git(two.root, "rev-parse", "HEAD").strip()
    assert killer.run("update", "--to", "v1.1", at=at, mode="before").returncode == -9
    assert git(two.root, "rev-parse", "HEAD").strip() == head  # the journal is written, the branch not moved
    code, out = cli(two, "update", "--continue")
    assert code == 0, out
    new = git(two.root, "rev-parse", "HEAD").strip()
    assert new != head and f"committed {new[:12]}" in out
    assert_updated(two, out)


def test_continue_refuses_when_the_branch_moved_elsewhere(two: Project, killer: Killer, tmp_path: Path) -> None:
    at = commit_point(killer, tmp_path, two)
    assert killer.run("update", "--to", "v1.1", at=at, mode="before").returncode == -9
    (two.root / "notes.txt").write_text("meanwhile\n")
    git(two.root, "add", "notes.txt")
    git(two.root, "commit", "-q", "-m", "someone else's commit")
    mine = git(two.root, "rev-parse", "HEAD").strip()
    code, out = cli(two, "update", "--continue")
    assert code == 1 and "neither where the interrupted update started" in out and "committed" not in out, out
    code, out = cli(two, "update", "--abort")
    assert code == 0, out
    assert git(two.root, "rev-parse", "HEAD").strip() == mine and Config.load(two.root).pin.ref == "v1.0"
    code, out = cli(two, "update", "--to", "v1.1")
    assert code == 0, out


@pytest.mark.parametrize("obstacle", ["index.lock", "edited vpatch.yaml"])
def test_a_failure_just_after_the_branch_moved_keeps_the_journal(two: Project, killer: Killer, tmp_path: Path,
                                                                 obstacle: str) -> None:
    at = commit_point(killer, tmp_path, two)
    before = state_of(two)
    lock = two.root / ".git" / "index.lock"
    hook = f"touch '{lock}'" if obstacle == "index.lock" else f"echo '# edited' >> '{two.root / 'vpatch.yaml'}'"
    for finish in ("--continue", "--abort"):
        proc = killer.run("update", "--to", "v1.1", at=at, mode="hook", VPATCH_GITKILL_HOOK=hook)
        assert proc.returncode == 1, proc.output
        assert "vpatch update --continue" in proc.output and "--abort" in proc.output and "Traceback" not in proc.output
        assert ("index.lock" in proc.output) == (obstacle == "index.lock"), proc.output
        assert in_progress(two)
        if finish == "--continue" and obstacle == "index.lock":
            code, out = cli(two, "update", finish)  # still locked: explained again, nothing lost
            assert code == 1 and "index.lock" in out and in_progress(two), out
        if obstacle == "index.lock":
            if finish == "--continue":
                lock.unlink()  # --abort needs no index change (the check-out never happened): it works despite the lock
        else:
            git(two.root, "stash", "-q")
        code, out = cli(two, "update", finish)
        assert code == 0, out
        lock.unlink(missing_ok=True)
        if obstacle != "index.lock":
            git(two.root, "stash", "drop", "-q")
        if finish == "--continue":
            assert_updated(two, out)
            git(two.root, "reset", "-q", "--hard", "HEAD~1")
        else:
            assert state_of(two) == before
    code, out = cli(two, "update", "--to", "v1.1")
    assert code == 0, out
    assert_updated(two, out)


def test_two_updates_at_once_one_wins_the_other_refuses(two: Project, killer: Killer, tmp_path: Path) -> None:
    at = commit_point(killer, tmp_path, two)
    gate = tmp_path / "gate"
    pid = killer.start("update", "--to", "v1.1", at=at, mode="pause", VPATCH_GITKILL_PAUSE=str(gate))
    try:
        while not gate.with_suffix(".reached").exists():  # the first run is at its commit point
            assert os.waitpid(pid, os.WNOHANG) == (0, 0), "the first update ended early"
            time.sleep(0.05)
        for command in (["update", "--to", "v1.1"], ["update", "--continue"], ["update", "--abort"], ["apply"],
                        ["export"]):
            code, out = cli(two, *command)
            assert code == 1 and f"another vpatch update is running (pid {pid})" in out, (command, out)
    finally:
        gate.touch()
        first = killer.wait(pid)
    assert first.returncode == 0, first.output
    assert_updated(two, first.output)
    retired = (two.patches / "RETIRED.md").read_text()
    assert retired.count("## 0001-kv-skip-null") == 1, retired


def test_a_lock_left_by_a_dead_process_is_no_obstacle(two: Project) -> None:
    (two.root / ".git" / "vpatch.lock").write_text("999999 update\n")
    code, out = cli(two, "update", "--to", "v1.1")
    assert code == 0, out
    assert_updated(two, out)


def patch_files(project: Project) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(project.patches.iterdir()) if p.is_file()}


def test_apply_killed_at_every_git_command_leaves_no_half_tree(two: Project, killer: Killer, tmp_path: Path) -> None:
    calls = git_calls(killer, tmp_path, "apply")
    tree = two.root / ".vpatch" / "tree"
    want = git(tree, "log", "--format=%s", "HEAD~2..HEAD")
    files = patch_files(two)
    kills = [(n, "before") for n in range(1, len(calls) + 1)]
    kills += [(n, "after") for n, c in enumerate(calls, 1) if c.split()[0] in WRITES]
    kills += [(n, "locked") for n, c in enumerate(calls, 1) if c.startswith("worktree add")]
    # a first apply (no tree yet), and an apply --force over a complete tree
    for first, (n, mode) in [(True, k) for k in kills] + [(False, k) for k in kills]:
        if first:
            shutil.rmtree(two.root / ".vpatch", ignore_errors=True)
            git(mirror_of(two), "worktree", "prune")
        args = ["apply"] if first else ["apply", "--force"]
        assert killer.run(*args, at=n, mode=mode).returncode == -9, (n, mode, first)
        assert patch_files(two) == files
        # no half-applied tree: the old complete one, none, or the new complete one
        if tree.exists():
            assert git(tree, "log", "--format=%s", "HEAD~2..HEAD") == want, (n, mode, first)
            assert git(tree, "status", "--porcelain") == "", (n, mode, first)
        code, out = cli(two, *args)
        assert code == 0, (n, mode, first, out)
        assert git(tree, "log", "--format=%s", "HEAD~2..HEAD") == want
    assert len(calls) > 8


def test_export_killed_at_every_git_command_is_completed_by_exporting_again(two: Project, killer: Killer,
                                                                           tmp_path: Path) -> None:
    assert cli(two, "apply")[0] == 0
    tree = two.root / ".vpatch" / "tree"
    # an amended patch (a changed file) and a plain new commit (a new file, numbered by export)
    git(tree, "checkout", "-q", "HEAD~1")
    (tree / "vllm/kv.py").write_text(KV_FIXED + "# amended\n")
    git(tree, "commit", "-q", "-a", "--amend", "--no-edit")
    git(tree, "cherry-pick", git(tree, "rev-parse", "HEAD@{2}").strip())  # 0002 back on top
    (tree / "vllm/new.py").write_text("NEW = 1\n")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", "Add a new module")
    before = patch_files(two)
    record = (two.root / ".vpatch" / "tree.json").read_bytes()
    calls = git_calls(killer, tmp_path, "export")
    after = patch_files(two)
    assert sorted(after) == ["0001-kv-skip-null.patch", "0002-parser-fix.patch", "0003-add-a-new-module.patch"]
    assert after != before
    kills = [{"at": n} for n in range(1, len(calls) + 1)] + [{"kill_at_write": n} for n in (1, 2, 3)]
    for kill in kills:
        for name in set(after) - set(before):
            (two.patches / name).unlink()
        for name, data in before.items():
            (two.patches / name).write_bytes(data)
        (two.root / ".vpatch" / "tree.json").write_bytes(record)
        assert killer.run("export", **kill).returncode == -9, kill  # type: ignore[arg-type]
        # each file is the old or the new one, never a mix; exporting again completes it
        assert all(patch_files(two).get(name) in (before.get(name), after.get(name)) for name in after), kill
        code, out = cli(two, "export")
        assert code == 0, (kill, out)
        assert patch_files(two) == after, kill
    assert len(calls) >= 6


def test_apply_killed_inside_worktree_add_then_state_folder_deleted_still_applies(two: Project, killer: Killer,
                                                                                 tmp_path: Path) -> None:
    calls = git_calls(killer, tmp_path, "apply")
    shutil.rmtree(two.root / ".vpatch")
    git(mirror_of(two), "worktree", "prune")  # as before the counted run
    add = next(n for n, c in enumerate(calls, 1) if c.startswith("worktree add"))
    assert killer.run("apply", at=add, mode="locked").returncode == -9
    assert "locked initializing" in git(mirror_of(two), "worktree", "list", "--porcelain")
    shutil.rmtree(two.root / ".vpatch")  # what a person does when a tool's state looks broken
    code, out = cli(two, "apply")
    assert code == 0, out
    assert git(two.root / ".vpatch" / "tree", "log", "--format=%s", "HEAD~2..HEAD") == "Fix the parser\nSkip null blocks\n"


@pytest.mark.parametrize("finish", ["--continue", "--abort"])
def test_a_kill_inside_gits_check_out_is_finished_or_undone(two: Project, killer: Killer, tmp_path: Path,
                                                            finish: str) -> None:
    """Killed while git's check-out had written some files of the new commit, not yet the index."""
    head = git(two.root, "rev-parse", "HEAD").strip()
    before = state_of(two)
    calls = git_calls(killer, tmp_path, "update", "--to", "v1.1")
    reset(two, head)
    checkout = next(n for n, c in enumerate(calls, 1) if c.startswith("read-tree -m -u"))
    assert killer.run("update", "--to", "v1.1", at=checkout, mode="before").returncode == -9
    new = git(two.root, "rev-parse", "HEAD").strip()
    assert new != head and in_progress(two)
    # half of git's work: the new vpatch.yaml written, the dropped patch removed; the index still old
    (two.root / "vpatch.yaml").write_text(git(two.root, "show", f"{new}:vpatch.yaml"))
    (two.patches / "0001-kv-skip-null.patch").unlink()
    code, out = cli(two, "update", finish)
    assert code == 0, out
    if finish == "--continue":
        assert_updated(two, out)
    else:
        assert state_of(two) == before
