"""A git history of vLLM's shape and size, built by one git fast-import from the real v0.29.0 tree of the release
history (so paths, file sizes and diff sizes are vLLM's), and a git-mode project of local patches on it.

main: the v0.29.0 tree, then `commits` "(#N)" squash commits each changing 1-3 real Python files. Every
`commits / releases` commits a release branch releases/v0.X forks (a version bump tagged v0.X.0), takes
cherry-picks (-x) of later main commits and tags v0.X.1; every other branch also gets a pick after the next
minor is cut, tagged v0.X.2 (a patch release cut after the next minor). Some main commits are reverted
('Revert "..." (#M)', "This reverts commit <sha>.") and some of those re-landed ('Reapply "..."').

The project pins v0.30.0 and carries `patches` patches, each changing two lines of its own real file; the
first 8 land on main verbatim (one cherry-picked for a patch release, one reverted and re-landed, one inside a
larger squash, one picked after the next minor), patch 9 lands and is reverted for good. The patches' events
sit at fixed fractions of the history and ordinary commits never touch the lines around a patch's hunk, so a
history of any size gives the same verdicts and first releases (tests/status/test_scale.py checks that).

Used by scripts/bench-status --vllm and tests/status/test_scale.py; built once per parameters into a cache folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

VERSION = 1  # of this generator: a change to what it builds changes the cache key
BASE = "v0.29.0"
START = 1788220800  # commit dates: one a minute from here
PICKS = 6  # cherry-picks per release branch before its .1


@dataclass(frozen=True)
class Shape:
    commits: int = 30000
    releases: int = 12  # release branches forked off main, the last at the tip
    patches: int = 30
    seed: int = 18

    def key(self, base_tree: str) -> str:
        text = json.dumps({**asdict(self), "version": VERSION, "base": base_tree}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Built:
    upstream: Path  # bare repository; its path is the project's upstream.git
    project: Path  # vpatch.yaml and patches/ (not a git repository: copy it, then git init)
    facts: dict[str, object] = field(default_factory=dict)  # what the generator put where (for reports)


# Where each landed patch's events sit, as fractions of the history (releases fork at k/releases).
LANDINGS: dict[int, dict[str, float]] = {
    1: {"land": 0.10},
    2: {"land": 0.22, "pick": 0.225},  # picked onto releases/v0.31 before v0.31.1
    3: {"land": 0.30, "revert": 0.32, "reland": 0.40},
    4: {"land": 0.45, "squash": 1},  # lands inside a squash that changes another file too
    5: {"land": 0.55},
    6: {"land": 0.62, "late_pick": 0.70},  # picked onto releases/v0.36 after v0.37.0: v0.36.2
    7: {"land": 0.76},
    8: {"land": 0.88},
    9: {"land": 0.35, "revert": 0.37},  # reverted for good: needed
}


def build(shape: Shape, history: Path, cache: Path) -> Built:
    """The history and project for `shape` under `cache` (built on first use; a half-built one is rebuilt)."""
    base_tree = _git(history, "rev-parse", f"{BASE}^{{tree}}").strip()
    folder = cache / shape.key(base_tree)
    done = folder / "built.json"
    if done.exists():
        return _serving(Built(folder / "upstream.git", folder / "project", json.loads(done.read_text())))
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    upstream = folder / "upstream.git"
    _git(folder, "init", "-q", "--bare", "-b", "main", str(upstream))
    facts = _Generator(shape, history, upstream).run()
    _write_project(shape, upstream, folder / "project", facts)
    done.write_text(json.dumps(facts, indent=1))
    return _serving(Built(upstream, folder / "project", facts))


def _serving(built: Built) -> Built:
    """Let clones of it filter blobs (a partial mirror), as GitHub does."""
    _git(built.upstream, "config", "uploadpack.allowFilter", "true")
    return built


def _git(cwd: Path, *args: str, input: bytes | None = None) -> str:
    return _git_bytes(cwd, *args, input=input).decode()


def _git_bytes(cwd: Path, *args: str, input: bytes | None = None) -> bytes:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_") or k.startswith("GIT_CONFIG")}
    return subprocess.run(["git", *args], cwd=cwd, input=input, env=env, check=True, capture_output=True).stdout


class _FastImport:
    """One git fast-import fed as the history is generated; `sha` asks it for a mark's commit id mid-stream."""

    def __init__(self, repo: Path) -> None:
        self.read_fd, write_fd = os.pipe()
        self.proc = subprocess.Popen(["git", "fast-import", "--quiet", "--done", f"--cat-blob-fd={write_fd}"],
                                     cwd=repo, stdin=subprocess.PIPE, pass_fds=(write_fd,))
        os.close(write_fd)
        self.answers = os.fdopen(self.read_fd, "rb")
        assert self.proc.stdin is not None
        self.stdin = self.proc.stdin

    def write(self, data: bytes) -> None:
        self.stdin.write(data)

    def sha(self, mark: int) -> str:
        self.stdin.write(b"get-mark :%d\n" % mark)
        self.stdin.flush()
        return self.answers.readline().decode().strip()

    def close(self) -> None:
        self.stdin.write(b"done\n")
        self.stdin.close()
        if self.proc.wait() != 0:
            raise RuntimeError("git fast-import failed")
        self.answers.close()


def _data(text: bytes) -> bytes:
    return b"data %d\n" % len(text) + text + b"\n"


@dataclass
class _Branch:
    name: str  # releases/v0.X
    minor: int
    fork: int  # main commit index it forks at
    head: int  # mark of its tip
    snapshot: dict[str, list[bytes]] = field(default_factory=dict)  # main's lines at the fork (copy on write)
    own: dict[str, list[bytes]] = field(default_factory=dict)  # lines changed on the branch
    picks: int = 0
    patch: int = 0  # the last vX.Y.<patch> tagged


@dataclass(frozen=True)
class _Edit:
    path: str
    at: int
    old: tuple[bytes, ...]
    new: tuple[bytes, ...]


class _Generator:
    def __init__(self, shape: Shape, history: Path, upstream: Path) -> None:
        self.shape, self.history, self.upstream = shape, history, upstream
        self.rng = random.Random(shape.seed)
        self.lines: dict[str, list[bytes]] = {}  # main's current lines of each file read so far
        self.marks = 0
        self.when = START
        self.edits: dict[int, tuple[str, list[_Edit]]] = {}  # mark -> (subject, edits) of recent main commits
        self.kept: set[int] = set()  # the landings of patches, kept in `edits` for their reverts and picks
        self.branches: list[_Branch] = []
        self.facts: dict[str, object] = {"landings": {}, "releases": {}}

    # --- the base tree ---

    def run(self) -> dict[str, object]:
        entries = [line.split("\t", 1) for line in _git(self.history, "ls-tree", "-r", BASE).splitlines()]
        files = [(meta.split()[0], meta.split()[2], path) for meta, path in entries if meta.split()[1] == "blob"]
        contents = self._read_blobs([sha for _, sha, _ in files])
        self.fi = _FastImport(self.upstream)
        stream = bytearray()
        for mode, sha, path in files:
            stream += b"M %s inline %s\n" % (mode.encode(), path.encode()) + _data(contents[sha])
        self.mark_main = self._commit("refs/heads/main", f"Initial: the vLLM {BASE} tree".encode(), bytes(stream), None)
        self.pool = sorted(p for _, sha, p in files if p.endswith(".py") and p.startswith(("vllm/", "tests/"))
                           and contents[sha].count(b"\n") >= 40)
        for _, sha, path in files:
            if path in self.pool:
                self.lines[path] = contents[sha].splitlines(keepends=True)
        del contents
        self._choose_patches()
        self._main_line()
        self.fi.close()
        return self.facts

    def _read_blobs(self, shas: list[str]) -> dict[str, bytes]:
        out = subprocess.run(["git", "cat-file", "--batch"], cwd=self.history, input="".join(f"{s}\n" for s in shas).encode(),
                             check=True, capture_output=True).stdout
        found, pos = {}, 0
        for sha in shas:
            nl = out.index(b"\n", pos)
            size = int(out[pos:nl].split()[2])
            found[sha] = out[nl + 1:nl + 1 + size]
            pos = nl + 1 + size + 1
        return found

    def _commit(self, ref: str, message: bytes, changes: bytes, parent: int | None) -> int:
        self.marks += 1
        self.when += 60
        who = b"vLLM Dev <dev@vllm.invalid> %d +0000" % self.when
        head = b"commit %s\nmark :%d\nauthor %s\ncommitter %s\n" % (ref.encode(), self.marks, who, who)
        self.fi.write(head + _data(message) + (b"from :%d\n" % parent if parent else b"") + changes)
        return self.marks

    # --- the patches and the lines ordinary commits leave alone ---

    def _choose_patches(self) -> None:
        candidates = [p for p in self.pool if p.startswith("vllm/") and len(self.lines[p]) >= 80]
        self.patch_files = self.rng.sample(candidates, self.shape.patches)
        self.zones: dict[str, range] = {}
        self.hunks: dict[int, tuple[str, int]] = {}
        for number, path in enumerate(self.patch_files, 1):
            n = len(self.lines[path])
            at = self.rng.randrange(n // 3, 2 * n // 3)
            self.hunks[number] = (path, at)
            self.zones[path] = range(at - 8, at + 10)
        self.facts["patches"] = {n: {"path": p, "line": at} for n, (p, at) in self.hunks.items()}

    @staticmethod
    def patched(line: bytes, number: int) -> bytes:
        body = line.rstrip(b"\n")
        return body + b"  # vendor fix %d\n" % number

    def patch_edit(self, number: int, lines: list[bytes]) -> _Edit:
        path, at = self.hunks[number]
        old = tuple(lines[at:at + 2])
        return _Edit(path, at, old, tuple(self.patched(line, number) for line in old))

    # --- main ---

    def _events(self) -> dict[int, list[tuple[str, int]]]:
        n, events = self.shape.commits, {}
        for number, where in LANDINGS.items():
            if number > self.shape.patches:
                continue
            for kind, fraction in where.items():
                if kind != "squash":
                    events.setdefault(max(1, int(fraction * n)), []).append((kind, number))
        return events

    def _main_line(self) -> None:
        n, every = self.shape.commits, self.shape.commits // self.shape.releases
        events = self._events()
        landed: dict[int, int] = {}  # patch -> mark of its standing landing
        reverts = 0
        for i in range(1, n + 1):
            for kind, number in events.get(i, []):
                if kind in ("land", "reland"):
                    landed[number] = self._land(number, relanded=kind == "reland", reverted_by=landed.get(-number))
                elif kind == "revert":
                    landed[-number] = self._revert(landed.pop(number), pr=80000 + number)
                else:  # a late pick comes after the next minor's fork: its own patch release
                    late = kind == "late_pick"
                    self._pick(self._branch_for(i, late=late), landed[number], bump=late)
            mark = self._ordinary(i)
            if i % 150 == 0 and i > 40:  # revert a recent ordinary commit; re-land every third one
                reverts += 1
                victim = self.rng.choice([m for m in range(mark - 30, mark) if m in self.edits and m not in self.kept
                                          and not self.edits[m][0].startswith(("Revert", "Reapply"))] or [mark])
                revert = self._revert(victim, pr=60000 + reverts)
                if reverts % 3 == 0 and revert:
                    self._reapply(victim, pr=70000 + reverts)
            for branch in list(self.branches):
                self._branch_work(branch, i, every)
            if self.mark_main - 200 not in self.kept:  # only recent commits are reverted or picked
                self.edits.pop(self.mark_main - 200, None)
            if i % every == 0:
                self._fork(i // every, i)

    def _ordinary(self, i: int) -> int:
        edits = []
        for path in self.rng.sample(self.pool, self.rng.choice((1, 1, 2, 3))):
            edit = self._random_edit(path, i)
            if edit is not None:
                edits.append(edit)
        area = self.rng.choice(("Core", "Bugfix", "Model", "Kernel", "Frontend", "Misc", "CI", "Doc", "V1"))
        return self._main_commit(f"[{area}] Change {i} to {edits[0].path if edits else 'nothing'} (#{20000 + i})", edits)

    def _random_edit(self, path: str, i: int) -> _Edit | None:
        lines = self.lines[path]
        k = self.rng.randint(1, min(30, len(lines) // 4))
        zone = self.zones.get(path, range(0))
        for _ in range(5):
            at = self.rng.randrange(0, len(lines) - k)
            if not (at < zone.stop and zone.start < at + k):
                old = tuple(lines[at:at + k])
                return _Edit(path, at, old, tuple(line.rstrip(b"\n") + b"  # r%d\n" % i for line in old))
        return None

    def _main_commit(self, subject: str, edits: list[_Edit], body: str = "") -> int:
        changes = bytearray()
        for edit in edits:
            self._apply(edit)
            changes += b"M 100644 inline %s\n" % edit.path.encode() + _data(b"".join(self.lines[edit.path]))
        message = (subject + ("\n\n" + body if body else "") + "\n").encode()
        self.mark_main = self._commit("refs/heads/main", message, bytes(changes), self.mark_main)
        self.edits[self.mark_main] = (subject, edits)
        return self.mark_main

    def _apply(self, edit: _Edit) -> None:
        lines = self.lines[edit.path]
        for branch in self.branches:  # the branch keeps main's lines as they were when it forked
            if edit.path not in branch.snapshot:
                branch.snapshot[edit.path] = lines
        self.lines[edit.path] = [*lines[:edit.at], *edit.new, *lines[edit.at + len(edit.old):]]

    def _land(self, number: int, *, relanded: bool, reverted_by: int | None) -> int:
        path, _ = self.hunks[number]
        edit = self.patch_edit(number, self.lines[path])
        edits = [edit]
        if LANDINGS[number].get("squash"):
            other = self._random_edit(self.rng.choice([p for p in self.pool if p not in self.zones]), 0)
            edits += [other] if other else []
        subject = f"[Bugfix] Vendor fix {number} (#{90000 + number})"
        body = ""
        if relanded and reverted_by is not None:
            subject = f'Reapply "{subject}" (#{85000 + number})'
            body = f"This reverts commit {self.fi.sha(reverted_by)}."
        mark = self._main_commit(subject, edits, body)
        self.kept.add(mark)
        landings = self.facts["landings"]
        assert isinstance(landings, dict)
        landings.setdefault(str(number), []).append(subject)
        return mark

    def _revert(self, mark: int, *, pr: int) -> int:
        subject, edits = self.edits[mark]
        undo = [_Edit(e.path, e.at, e.new, e.old) for e in edits
                if tuple(self.lines[e.path][e.at:e.at + len(e.new)]) == e.new]
        if not undo:
            return 0
        return self._main_commit(f'Revert "{subject}" (#{pr})', undo, f"This reverts commit {self.fi.sha(mark)}.")

    def _reapply(self, mark: int, *, pr: int) -> None:
        subject, edits = self.edits[mark]
        redo = [e for e in edits if tuple(self.lines[e.path][e.at:e.at + len(e.old)]) == e.old]
        if redo:
            self._main_commit(f'Reapply "{subject}" (#{pr})', redo)

    # --- release branches ---

    def _fork(self, k: int, i: int) -> None:
        minor = 29 + k
        branch = _Branch(f"releases/v0.{minor}", minor, i, self.mark_main)
        self.branches.append(branch)
        self._bump(branch, patch=0)

    def _bump(self, branch: _Branch, *, patch: int) -> None:
        branch.patch = patch
        version = f"0.{branch.minor}.{patch}"
        content = f'__version__ = "{version}"\n'.encode()
        changes = b"M 100644 inline vllm/_version.py\n" + _data(content)
        branch.head = self._commit(f"refs/heads/{branch.name}", f"Bump version to {version}".encode(), changes, branch.head)
        self.fi.write(b"reset refs/tags/v%s\nfrom :%d\n\n" % (version.encode(), branch.head))
        releases = self.facts["releases"]
        assert isinstance(releases, dict)
        releases[f"v{version}"] = branch.name

    def _branch_work(self, branch: _Branch, i: int, every: int) -> None:
        """PICKS cherry-picks of ordinary main commits in the branch's first 0.8 releases, then its .1."""
        age = i - branch.fork
        if branch.picks < PICKS and age > 0 and age % max(1, every * 8 // (10 * PICKS)) == 0:
            self._pick(branch, self.mark_main, bump=False)
        if branch.picks >= PICKS and age == every * 8 // 10:
            self._bump(branch, patch=1)
        if branch.minor % 2 == 0 and age == every * 13 // 10:  # after the next minor: a .2 with one more pick
            self._pick(branch, self.mark_main, bump=False)
            self._bump(branch, patch=branch.patch + 1)
        if age > 2 * every:
            self.branches.remove(branch)

    def _branch_for(self, i: int, *, late: bool) -> _Branch:
        """The branch a landing is picked onto: the newest one forked before it (late: the one before that)."""
        open_ = [b for b in self.branches if b.fork < i]
        return open_[-2] if late else open_[-1]

    def _pick(self, branch: _Branch, mark: int, *, bump: bool) -> None:
        subject, edits = self.edits[mark]
        changes = bytearray()
        for edit in edits:
            lines = branch.own.get(edit.path) or branch.snapshot.get(edit.path) or self.lines[edit.path]
            lines = [*lines[:edit.at], *edit.new, *lines[edit.at + len(edit.old):]]
            branch.own[edit.path] = lines
            changes += b"M 100644 inline %s\n" % edit.path.encode() + _data(b"".join(lines))
        message = f"{subject}\n\n(cherry picked from commit {self.fi.sha(mark)})\n".encode()
        branch.head = self._commit(f"refs/heads/{branch.name}", message, bytes(changes), branch.head)
        branch.picks += 1
        if bump:
            self._bump(branch, patch=branch.patch + 1)


def _write_project(shape: Shape, upstream: Path, root: Path, facts: dict[str, object]) -> None:
    """vpatch.yaml pinned at v0.30.0 and one format-patch file per patch, made from a commit on the pin."""
    (root / "patches").mkdir(parents=True)
    (root / "vpatch.yaml").write_text(f"upstream:\n  source: git\n  git: {upstream.as_uri()}\npin:\n  ref: v0.30.0\n"
                                      "patches: patches\n")
    patches = facts["patches"]
    assert isinstance(patches, dict)
    fi = _FastImport(upstream)
    pin = _git(upstream, "rev-parse", "v0.30.0").strip()
    for number, where in patches.items():
        path, at = where["path"], where["line"]
        lines = _git_bytes(upstream, "show", f"v0.30.0:{path}").splitlines(keepends=True)
        lines[at:at + 2] = [_Generator.patched(line, int(number)) for line in lines[at:at + 2]]
        pr = 90000 + int(number) if int(number) in LANDINGS else 91000 + int(number)
        message = (f"Vendor fix {number} in {path.rsplit('/', 1)[-1]}\n\nWhy this change exists.\n\nOrigin: vendor\n"
                   f"Upstream-PR: {pr}\nLast-Update: 2026-09-01\n").encode()
        who = b"Vendor <vendor@vpatch.invalid> 1788220800 +0000"
        fi.write(b"commit refs/vendor/%d\nauthor %s\ncommitter %s\n" % (int(number), who, who) + _data(message)
                 + f"from {pin}\n".encode() + b"M 100644 inline %s\n" % path.encode() + _data(b"".join(lines)))
    fi.close()
    for number in patches:
        raw = _git(upstream, "-c", "core.abbrev=40", "format-patch", "-1", "--stdout", "--zero-commit", "--full-index",
                   "--no-signature", "--no-stat", "-k", "--no-renames", f"refs/vendor/{number}")
        (root / "patches" / f"{int(number):04d}-vendor-fix-{number}.patch").write_text(raw)
        _git(upstream, "update-ref", "-d", f"refs/vendor/{number}")
    _git(upstream, "gc", "--quiet", "--prune=now")
