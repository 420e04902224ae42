"""The in-memory apply check must say exactly what `git apply --check` says, forward and in reverse."""

from __future__ import annotations

import random
from pathlib import Path

from conftest import git as sh

from vpatch import git
from vpatch.series.filediff import parse_diff
from vpatch.verdict import applycheck
from vpatch.verdict.applycheck import ApplyOutcome


def make_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    sh(repo, "init", "-q")
    return repo


def write_commit(repo: Path, files: dict[str, bytes | None]) -> str:
    for name, content in files.items():
        if content is None:
            if (repo / name).exists():
                (repo / name).unlink()
        else:
            (repo / name).write_bytes(content)
    sh(repo, "add", "-A")
    sh(repo, "commit", "-q", "--allow-empty", "-m", "x")
    return sh(repo, "rev-parse", "HEAD").strip()


def git_says(repo: Path, commit: str, diff: bytes, paths: list[str], reverse: bool) -> bool:
    with git.temp_index(repo) as env:
        git.load_index(repo, env, commit, paths)
        return git.apply_cached(repo, env, diff, reverse=reverse).returncode == 0


def mutate(rng: random.Random, lines: list[bytes]) -> list[bytes]:
    out = list(lines)
    for _ in range(rng.randint(0, 4)):
        kind = rng.choice(["insert", "change", "delete", "dup", "top"])
        at = rng.randrange(len(out) + 1)
        if kind == "insert":
            out[at:at] = [b"inserted %d\n" % rng.randrange(1000)] * rng.randint(1, 3)
        elif kind == "change" and out:
            out[min(at, len(out) - 1)] = b"changed\n"
        elif kind == "delete" and out:
            del out[min(at, len(out) - 1)]
        elif kind == "dup" and out:
            start = rng.randrange(len(out))
            out[at:at] = out[start:start + rng.randint(1, 8)]
        elif kind == "top":
            out[0:0] = [b"header\n"] * rng.randint(1, 5)
    return out


def test_agrees_with_git_apply_on_random_patches_and_upstreams(tmp_path: Path) -> None:
    rng = random.Random(6)
    repo = make_repo(tmp_path)
    disagreements = []
    tried = 0
    for case in range(60):
        base = [b"line %d\n" % (i % rng.choice([7, 13, 1000])) for i in range(rng.randint(1, 40))]
        if rng.random() < 0.2:
            base[-1] = base[-1].rstrip(b"\n")  # no newline at the end of the file
        patched = mutate(rng, base)
        if patched == base:
            patched = [*base, b"appended\n"]
        c_base = write_commit(repo, {"f.txt": b"".join(base), "g.txt": None})
        c_patched = write_commit(repo, {"f.txt": b"".join(patched)})
        diff = sh(repo, "-c", "core.abbrev=40", "diff", "--full-index", c_base, c_patched).encode()
        files = parse_diff(diff, where="case")
        for target_lines in (base, patched, mutate(rng, base), mutate(rng, patched)):
            target = write_commit(repo, {"f.txt": b"".join(target_lines)})
            for reverse in (False, True):
                mine = applycheck.check(files, {"f.txt": b"".join(target_lines)}, reverse=reverse)
                assert mine.outcome is not ApplyOutcome.UNKNOWN
                theirs = git_says(repo, target, diff, ["f.txt"], reverse)
                tried += 1
                if (mine.outcome is not ApplyOutcome.FAILS) != theirs:
                    disagreements.append((case, reverse, mine.outcome, theirs))
    assert tried == 480
    assert disagreements == []


def test_new_and_deleted_files(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    a = write_commit(repo, {"keep": b"k\n"})
    b = write_commit(repo, {"new.py": b"x = 1\ny = 2\n"})
    new_diff = sh(repo, "diff", "--full-index", a, b).encode()
    files = parse_diff(new_diff, where="new")
    assert applycheck.check(files, {"new.py": None}).outcome is ApplyOutcome.CLEAN
    assert applycheck.check(files, {"new.py": b"other\n"}).outcome is ApplyOutcome.FAILS
    assert applycheck.check(files, {"new.py": b"x = 1\ny = 2\n"}, reverse=True).outcome is ApplyOutcome.CLEAN
    assert applycheck.check(files, {"new.py": b"x = 1\ny = 2\nz\n"}, reverse=True).outcome is ApplyOutcome.FAILS
    assert applycheck.check(files, {"new.py": None}, reverse=True).outcome is ApplyOutcome.FAILS
    deleted = parse_diff(sh(repo, "diff", "--full-index", b, a).encode(), where="del")
    assert applycheck.check(deleted, {"new.py": b"x = 1\ny = 2\n"}).outcome is ApplyOutcome.CLEAN
    assert applycheck.check(deleted, {"new.py": b"x = 1\n"}).outcome is ApplyOutcome.FAILS


def test_offsets_are_reported_like_git(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    base = b"".join(b"line %d\n" % i for i in range(40))
    a = write_commit(repo, {"f": base})
    b = write_commit(repo, {"f": base.replace(b"line 20\n", b"line 20 fixed\n")})
    files = parse_diff(sh(repo, "diff", "--full-index", a, b).encode(), where="x")
    result = applycheck.check(files, {"f": b"top\ntop\ntop\n" + base})
    assert result.outcome is ApplyOutcome.OFFSETS
    assert result.offsets == ((1, 21, 3),)
    assert result.result is not None and b"line 20 fixed\n" in (result.result["f"] or b"")


def test_outside_the_model_is_unknown() -> None:
    diff = b"diff --git a/x b/x\nold mode 100644\nnew mode 100755\n"
    assert applycheck.check(parse_diff(diff, where="mode"), {"x": b""}).outcome is ApplyOutcome.UNKNOWN
