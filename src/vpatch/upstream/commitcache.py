"""Facts about upstream commits that never change (patch-ids, messages, ranges between two commits),
kept by commit id in the cache folder, so a second `vpatch status` asks git only about commits it has not seen.

A commit id fixes the commit's tree and parents, so what is stored under it holds in every repository and
forever; only ranges between full commit ids are memoised, never between names that can move. The store is
a handful of JSON shards written whole (temporary file, then rename); a shard or entry that does not read
back as expected is ignored and rebuilt from git.

Questions about commits inside a range a status declared (rangeindex.py) are answered from that range's one
walk; what is kept per range is small (the commits that touch a patch's files or name its PR, a bisection's
first-parent line, a derived answer via `memo`), never a list of every commit in it.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from vpatch import git
from vpatch.base import atomic_write, cache_dir
from vpatch.upstream import rangeindex

T = TypeVar("T")

_SHA = re.compile(r"[0-9a-f]{40}")
_JOINED = re.compile(r"(?:[0-9a-f]{40})*")
# Few shards: a first run touches most of them, and each is rewritten whole when it changes.
_SHARDS = 16
_VERSION = 2  # 2: no per-range list of every commit (topo order) is kept
_FLUSH_EVERY_S = 1.0


class CommitCache:
    """The store under one folder; shards are read once per process and written when they change."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._shards: dict[str, dict[str, Any]] = {}
        self._dirty: set[str] = set()
        self._written = time.monotonic()
        # (base, tip) -> first_parent_commits's line as decoded and checked once: each landing search asks for it
        self.lines: dict[tuple[str, str], tuple[str, ...]] = {}

    def get(self, key: str, field: str) -> Any:
        entry = self._shard(key).get(key)
        return entry.get(field) if isinstance(entry, dict) else None

    def put(self, key: str, field: str, value: Any) -> None:
        shard = self._shard(key)
        entry = shard.get(key)
        if not isinstance(entry, dict):
            entry = shard[key] = {}
        entry[field] = value
        self._dirty.add(_shard_name(key))

    def flush(self, *, now: bool = False) -> None:
        """Write the changed shards: at most once a second unless `now` (each is rewritten whole, and a first
        status learns hundreds of facts; what a kill loses is only asked of git again)."""
        if not self._dirty or (not now and time.monotonic() - self._written < _FLUSH_EVERY_S):
            return
        for name in sorted(self._dirty):
            data = {"version": _VERSION, "entries": self._shards[name]}
            atomic_write(self.root / f"{name}.json", json.dumps(data, separators=(",", ":")).encode(), durable=False)
        self._dirty.clear()
        self._written = time.monotonic()

    def _shard(self, key: str) -> dict[str, Any]:
        name = _shard_name(key)
        if name not in self._shards:
            self._shards[name] = _read_shard(self.root / f"{name}.json")
        return self._shards[name]


def _shard_name(key: str) -> str:
    return f"{int(key[0], 16) % _SHARDS:x}"


def _read_shard(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}  # absent or corrupt: rebuilt as it is used
    if not isinstance(data, dict) or data.get("version") != _VERSION or not isinstance(data.get("entries"), dict):
        return {}
    entries: dict[str, Any] = data["entries"]
    return entries


_open: dict[Path, CommitCache] = {}
_at_exit: list[object] = []


def store() -> CommitCache:
    """The cache under the current cache folder (one object per folder per process)."""
    root = cache_dir() / "commit-facts"
    if root not in _open:
        if not _open and save not in _at_exit:
            atexit.register(save)  # what the last second learnt (flush writes at most once a second)
            _at_exit.append(save)
        _open[root] = CommitCache(root)
    return _open[root]


def save() -> None:
    """Write everything learnt so far (the end of a status or update)."""
    for cache in _open.values():
        cache.flush(now=True)


def reset() -> None:
    """Write what this process learnt (as its exit would) and forget what it read: the next use reads the folder
    again, as a new process would."""
    save()
    _open.clear()
    rangeindex.forget()


def declare(repo: Path, base: str, tips: Sequence[str], *, path_sets: Sequence[Sequence[str]],
            greps: Sequence[str]) -> None:
    """The range base..tips that questions (patch-ids on each of `path_sets`, messages naming `greps`) will be
    asked about: one walk, when the first of them is not answered by the cache (rangeindex.declare)."""
    rangeindex.declare(repo, base, tips, path_sets=path_sets, greps=greps)


def memo(anchor: str, name: str, parts: Sequence[str], compute: Callable[[], T], *,
         dump: Callable[[T], Any], load: Callable[[Any], T | None]) -> T:
    """An answer derived only from commit ids (`anchor` and `parts`), kept under `anchor`: `load` turns what was
    stored back into the answer (None: unreadable, compute again)."""
    cache = store()
    field = _key(name, *parts)
    stored = cache.get(anchor, field)
    if stored is not None:
        try:
            found = load(stored)
        except (TypeError, ValueError, KeyError, IndexError):
            found = None
        if found is not None:
            return found
    answer = compute()
    cache.put(anchor, field, dump(answer))
    cache.flush()
    return answer


def _is_sha(ref: str | None) -> bool:
    return ref is None or bool(_SHA.fullmatch(ref))


def _sha_list(value: Any) -> list[str] | None:
    if isinstance(value, list) and all(isinstance(v, str) and _SHA.fullmatch(v) for v in value):
        return value
    return None


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def patch_id_commits(repo: Path, base: str | None, tip: str, paths: Sequence[str]) -> dict[str, list[str]]:
    """`git.patch_id_commits` with the per-commit patch-ids (and the range's commit list) from the cache."""
    if not _is_sha(base) or not _is_sha(tip):
        return git.patch_id_commits(repo, base, tip, paths)
    cache = store()
    paths_key = _key(*paths)
    known_range = rangeindex.find(repo, base, tip, paths=paths)
    if known_range is not None:
        if not known_range.prefetched:
            _prefetch_patch_ids(repo, known_range)
        inside, wanted = known_range.ancestors(tip), set(paths)
        touching = known_range.newest_first_of(
            [c for c, names in known_range.touched.items() if c in inside and wanted.intersection(names)])
    else:
        range_key = _key("touching", base or "", paths_key)
        touching_list = _sha_list(cache.get(tip, range_key))
        if touching_list is None:
            touching_list = git.commits_touching(repo, base, tip, paths)
            cache.put(tip, range_key, touching_list)
        touching = touching_list
    known = patch_ids(repo, touching, paths)
    ids: dict[str, list[str]] = {}
    for commit in touching:  # newest first, as git log lists them
        if known[commit]:
            ids.setdefault(known[commit], []).append(commit)
    return ids


def _prefetch_patch_ids(repo: Path, known_range: rangeindex.Range) -> None:
    """The patch-id of every touching commit of the range on each declared path set, from one `log -p` and
    one `patch-id` for all of them (a pair per patch costs more than the diffs at vLLM's size)."""
    cache = store()
    wanted: dict[str, tuple[str, tuple[str, ...], str]] = {}  # stand-in id -> (commit, path set, its key)
    for group in known_range.path_sets:
        paths_key, names = _key(*group), set(group)
        for commit, touched in known_range.touched.items():
            pid = cache.get(commit, "pid:" + paths_key)
            if names.intersection(touched) and not (isinstance(pid, str) and (pid == "" or _SHA.fullmatch(pid))):
                wanted[hashlib.sha1(f"{commit} {paths_key}".encode()).hexdigest()] = (commit, group, paths_key)
    if wanted:
        commits = sorted({c for c, _, _ in wanted.values()})
        diffs = git.commit_diffs(repo, commits, sorted(known_range.paths))
        stream = bytearray()
        complete = {}
        for stand_in, (commit, group, paths_key) in wanted.items():
            changed = set(group).intersection(known_range.touched[commit])
            if not changed.issubset(diffs.get(commit, {})):
                continue  # a file name the split did not recognise: left to the per-patch diff
            complete[stand_in] = (commit, paths_key)
            stream += b"commit %s\n" % stand_in.encode()
            stream += b"".join(diffs[commit][path] for path in sorted(changed))
        found = git.stream_patch_ids(repo, bytes(stream))
        for stand_in, (commit, paths_key) in complete.items():
            cache.put(commit, "pid:" + paths_key, found.get(stand_in, ""))
        cache.flush()
    known_range.prefetched = True


def patch_ids(repo: Path, commits: Sequence[str], paths: Sequence[str]) -> dict[str, str]:
    """Commit -> stable patch-id of its change to `paths` ("" when it changes none of them), kept by commit id."""
    cache = store()
    paths_key = _key(*paths)
    known = {c: cache.get(c, "pid:" + paths_key) for c in commits}
    missing = [c for c, pid in known.items() if not (isinstance(pid, str) and (pid == "" or _SHA.fullmatch(pid)))]
    if missing:
        found = git.commit_patch_ids(repo, missing, paths)
        for commit in missing:
            known[commit] = found.get(commit, "")  # "": no change to `paths` (stored, so not asked again)
            cache.put(commit, "pid:" + paths_key, known[commit])
    cache.flush()
    return {c: str(pid) for c, pid in known.items()}


def log_records(repo: Path, base: str | None, tip: str, *, grep: Sequence[str] = (),
                commits: Sequence[str] = ()) -> list[git.LogRecord]:
    """`git.log_records` with messages kept by commit id and grep results kept per range."""
    cache = store()
    known_range = None if commits or not grep else rangeindex.find(repo, base, tip, greps=grep)
    if known_range is not None:
        inside = known_range.ancestors(tip)
        found = {c: r for c, r in known_range.matched.items()
                 if c in inside and any(g in r.subject or g in r.body for g in grep)}
        return [found[c] for c in known_range.newest_first_of(list(found))]
    if commits:
        wanted = list(commits)
    elif _is_sha(base) and _is_sha(tip):
        range_key = _key("grep", base or "", *grep)
        matched = _sha_list(cache.get(tip, range_key))
        if matched is None:
            records = git.log_records(repo, base, tip, grep=grep)
            _remember(cache, records)
            cache.put(tip, range_key, [r.commit for r in records])
            cache.flush()
            return records
        wanted = matched
    else:
        return git.log_records(repo, base, tip, grep=grep)
    if not all(_is_sha(c) for c in wanted):
        return git.log_records(repo, base, tip, grep=grep, commits=commits)
    messages = {c: cache.get(c, "message") for c in wanted}
    missing = [c for c, m in messages.items() if not _is_message(m)]
    if missing:
        records = git.log_records(repo, None, tip, commits=missing)
        _remember(cache, records)
        cache.flush()
        messages.update({r.commit: [r.subject, r.body] for r in records})
    return [git.LogRecord(c, messages[c][0], messages[c][1]) for c in wanted if _is_message(messages.get(c))]


def _is_message(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)


def _remember(cache: CommitCache, records: Sequence[git.LogRecord]) -> None:
    for r in records:
        cache.put(r.commit, "message", [r.subject, r.body])


def topo_positions(repo: Path, base: str | None, tip: str, commits: Sequence[str]) -> dict[str, int]:
    """Where each of `commits` sits in base..tip oldest first, parents before children (absent: not in it).
    From a declared range when it holds base..tip, else from `git.topo_order` (never stored: at vLLM's size
    one list per range was most of the cache)."""
    known_range = rangeindex.find(repo, base, tip)
    if known_range is not None:
        inside = known_range.ancestors(tip)
        return {c: known_range.position(c) for c in commits if c in inside}
    order = {c: i for i, c in enumerate(git.topo_order(repo, base, tip))}
    return {c: order[c] for c in commits if c in order}


def first_parent_commits(repo: Path, base: str, tip: str) -> list[str]:
    """`git.first_parent_commits`, kept per range of commit ids (the line a bisection walks)."""
    if not _is_sha(base) or not _is_sha(tip):
        return git.first_parent_commits(repo, base, tip)
    cache = store()
    kept = cache.lines.get((base, tip))
    if kept is not None:
        return list(kept)
    range_key = _key("first-parent-joined", base)
    stored = cache.get(tip, range_key)
    # one string of ids end to end: a tenth of the parsing and checking of a list at vLLM's length
    if isinstance(stored, str) and _JOINED.fullmatch(stored):
        line = [stored[i:i + 40] for i in range(0, len(stored), 40)]
    else:
        line = git.first_parent_commits(repo, base, tip)
        cache.put(tip, range_key, "".join(line))
        cache.flush()
    cache.lines[(base, tip)] = tuple(line)
    return line


def diff_patch_ids(repo: Path, diffs: Sequence[bytes]) -> None:
    """Put the patch-id of each of `diffs` (the patches' own) in the cache: one `patch-id` for all not there."""
    cache = store()
    digests = {hashlib.sha256(d).hexdigest(): d for d in diffs}
    missing = {k: d for k, d in digests.items() if not isinstance(cache.get(k, "diff-pid"), str)}
    if not missing:
        return
    stream = b"".join(b"commit %s\n" % k[:40].encode() + d for k, d in missing.items())
    found = git.stream_patch_ids(repo, stream)
    for k in missing:
        cache.put(k, "diff-pid", found.get(k[:40], ""))
    cache.flush()


def diff_patch_id(repo: Path, diff: bytes) -> str | None:
    """`git.patch_id` of a diff, kept by the diff's own hash (a patch file's diff rarely changes)."""
    digest = hashlib.sha256(diff).hexdigest()
    cache = store()
    pid = cache.get(digest, "diff-pid")
    if isinstance(pid, str) and (pid == "" or _SHA.fullmatch(pid)):
        return pid or None
    found = git.patch_id(repo, diff)
    cache.put(digest, "diff-pid", found or "")
    cache.flush()
    return found


def merge_base(repo: Path, a: str, b: str) -> str | None:
    """`git.merge_base`, kept by the two commit ids (their best common ancestor never changes)."""
    if not _is_sha(a) or not _is_sha(b):
        return git.merge_base(repo, a, b)
    cache = store()
    field = "merge-base:" + b
    known = cache.get(a, field)
    if isinstance(known, str) and (known == "" or _SHA.fullmatch(known)):
        return known or None
    answer = git.merge_base(repo, a, b)
    cache.put(a, field, answer or "")
    cache.flush()
    return answer


def is_ancestor(repo: Path, ancestor: str, descendant: str) -> bool:
    """`git.is_ancestor`, kept by commit id (ancestry between two commit ids never changes)."""
    if not _is_sha(ancestor) or not _is_sha(descendant):
        return git.is_ancestor(repo, ancestor, descendant)
    cache = store()
    field = "ancestor-of:" + descendant
    known = cache.get(ancestor, field)
    if isinstance(known, bool):
        return known
    from_range = rangeindex.ancestry(repo, ancestor, descendant)
    answer = git.is_ancestor(repo, ancestor, descendant) if from_range is None else from_range
    cache.put(ancestor, field, answer)
    cache.flush()
    return answer
