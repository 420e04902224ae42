"""Regression evidence: upstream's own tests of the files a patch touches, run on a tree without the patch and
with it, in the probe venv, counted as Ubuntu's migration gate counts a package's tests: a test that passes
without the patch and does not pass with it is a **regression**; one that fails on both sides is upstream's.

The tests run as they are, with pytest, from the tree root, under ``--confcutdir tests/<folder>``: the
conftest files of the tests' own folder down are loaded, vLLM's root ``tests/conftest.py`` is not (it imports
the whole engine and model runners, and frees the accelerator after every test). A test that needs a root
fixture then errors on both sides: counted as upstream's, never as the patch's. Results are cached per tree,
so an unpatched tree's results serve every patch checked on it. Each run is a child of the session's warm
interpreter where it can be (pytest and the venv's imports once, vllm and the tests from the tree each time), else a
fresh process; HOME is the session's own folder either way (`Session.run_env`).

They run offline and bounded (probes/child/upstream_tests.py runs pytest): the hub's clients offline, any other
reach for the network stopped at once, a deadline per test file. A test that needs a download, a GPU or a server,
or that ran past its file's deadline, is **not run here** on both sides and named so: never a regression, never
minutes of retries. A probe's ``upstream_tests:`` may name node ids: one that names no test on the base tree is an
error of the probe.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from vpatch import git
from vpatch.base import Event, ProcessError, Reporter, VpatchError, atomic_write, cache_dir, run_process, silent
from vpatch.probes import workspace as probe_runs
from vpatch.probes.child import UPSTREAM_TESTS
from vpatch.probes.env import LOCK_NAME, EnvError, Requirements, probe_venv
from vpatch.probes.file import Probe, probe_for
from vpatch.series import Patch

RESULTS = "upstream-tests"  # the cache folder under $VPATCH_CACHE
FILE_DEADLINE_S = 120.0  # one test file's tests, in seconds: past it, the file's other tests are not run here
START_S = 300.0  # what one pytest run may take beyond its files' deadlines (its start, the collection)
PASSED, FAILED, ERROR, SKIPPED, NOT_RUN = "passed", "failed", "error", "skipped", "not run here"
# The runner's version: part of every cache key, so a change in how tests run or are read runs them again.
_RUNNER = b"vpatch-upstream-tests-2"


class RegressionError(VpatchError):
    """Upstream's tests cannot be run for a patch (no venv to run them in)."""


@dataclass(frozen=True)
class TestRun:
    """Upstream's tests on one tree: each test's outcome by node id."""

    __test__ = False  # not a test class, whatever pytest thinks of the name

    tree: str
    tests: tuple[str, ...]  # the test files (or node ids) asked for
    results: tuple[tuple[str, str], ...]  # (node id, passed | failed | error | skipped | not run here), sorted
    seconds: float = 0.0
    detail: str = ""  # pytest's last line, or why nothing ran
    ran: bool = True  # False: pytest could not run at all (the evidence is then missing, never "no regression")
    cached: bool = False
    # what each test NOT_RUN needed: "download", "gpu", "server", or "deadline" (its file ran past its deadline)
    needs: tuple[tuple[str, str], ...] = ()
    missing: tuple[str, ...] = ()  # node ids asked for that name no test in this tree

    def outcomes(self) -> dict[str, str]:
        return dict(self.results)

    def count(self, status: str) -> int:
        return sum(1 for _, s in self.results if s == status)

    def to_json(self) -> dict[str, Any]:
        return {"tree": self.tree, "tests": list(self.tests), "results": [list(r) for r in self.results],
                "seconds": self.seconds, "detail": self.detail, "needs": [list(n) for n in self.needs],
                "missing": list(self.missing)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TestRun:
        return cls(str(data["tree"]), tuple(data["tests"]), tuple((str(n), str(s)) for n, s in data["results"]),
                   float(data["seconds"]), str(data["detail"]), cached=True,
                   needs=tuple((str(n), str(w)) for n, w in data["needs"]), missing=tuple(map(str, data["missing"])))


@dataclass(frozen=True)
class Regressions:
    """A patch's regression evidence on one base: its tests without the patch and with it."""

    patch: str  # the patch file
    ref: str  # what the base is called
    tests: tuple[str, ...]
    base: TestRun | None  # None: no tests to run, or (with `unavailable`) nowhere to run them
    patched: TestRun | None
    unavailable: str = ""  # why the tests could not be run at all (no probe venv): no evidence either way

    @property
    def complete(self) -> bool:
        """Both sides ran (or there was nothing to run): the evidence says something either way."""
        if self.unavailable:
            return False
        return not self.tests or (self.base is not None and self.patched is not None
                                  and self.base.ran and self.patched.ran)

    @property
    def not_run_here(self) -> tuple[tuple[str, str], ...]:
        """Tests not run here on either side, so on neither (what each needed): no evidence either way."""
        found: dict[str, str] = {}
        for run in (self.base, self.patched):
            found.update((n, need) for n, need in (run.needs if run is not None else ()) if n not in found)
        return tuple(sorted(found.items()))

    @property
    def regressed(self) -> tuple[str, ...]:
        """Tests that pass without the patch and do not pass with it (fail, error, skip or vanish)."""
        if self.base is None or self.patched is None or not self.complete:
            return ()
        after, away = self.patched.outcomes(), dict(self.not_run_here)
        return tuple(n for n, s in self.base.results if s == PASSED and after.get(n) != PASSED and n not in away)

    @property
    def upstreams(self) -> tuple[str, ...]:
        """Tests that fail or error on both sides: upstream's, not the patch's."""
        if self.base is None or self.patched is None:
            return ()
        after, away = self.patched.outcomes(), dict(self.not_run_here)
        return tuple(n for n, s in self.base.results if s in (FAILED, ERROR) and after.get(n) in (FAILED, ERROR)
                     and n not in away)

    @property
    def passed(self) -> int:
        """Tests that pass on both sides."""
        if self.base is None or self.patched is None:
            return 0
        after = self.patched.outcomes()
        return sum(1 for n, s in self.base.results if s == PASSED and after.get(n) == PASSED)

    def says(self) -> str:
        """One line: what upstream's tests said about the patch."""
        if not self.tests:
            return "upstream tests: none found for the files it touches"
        if self.unavailable:
            return f"upstream tests not run: {self.unavailable}"
        if not self.complete:
            broken = next(r for r in (self.base, self.patched) if r is not None and not r.ran)
            side = "without" if broken is self.base else "with"
            return f"upstream tests could not run {side} the patch: {broken.detail}"
        files = len({t.split("::", 1)[0] for t in self.tests})
        text = f"upstream tests ({files} file{'s' if files != 1 else ''}) on {self.ref}: {self.passed} passed on both"
        if self.regressed:
            shown = ", ".join(self.regressed[:3]) + (f" and {len(self.regressed) - 3} more" if len(self.regressed) > 3
                                                    else "")
            text += f"; {len(self.regressed)} REGRESSION{'S' if len(self.regressed) != 1 else ''}: {shown}"
        else:
            text += "; no regression"
        if self.upstreams:
            text += f"; {len(self.upstreams)} failing on both sides (upstream's)"
        if self.not_run_here:
            needs: dict[str, list[str]] = {need: [] for need in NEEDS}
            for test, need in self.not_run_here:
                needs.setdefault(need, []).append(test)
            needs = {need: tests for need, tests in needs.items() if tests}
            text += f"; {len(self.not_run_here)} not run here (" + "; ".join(
                f"{NEEDS.get(need, need)}: {', '.join(tests[:2])}" + (f" and {len(tests) - 2} more" if len(tests) > 2
                                                                       else "")
                for need, tests in needs.items()) + ")"
        return text

    def to_json(self) -> dict[str, Any]:
        return {"patch": self.patch, "ref": self.ref, "tests": list(self.tests), "complete": self.complete,
                "regressions": list(self.regressed), "upstream_failures": list(self.upstreams),
                "not_run_here": dict(self.not_run_here),
                "passed": self.passed, "says": self.says()}


# What a test not run here needed, in words.
NEEDS = {"download": "need a download", "gpu": "need a GPU", "server": "need a server",
         "deadline": "past their file's deadline"}


def tests_for(repo: Path, trees: Sequence[str], paths: Sequence[str]) -> tuple[str, ...]:
    """Upstream's test files of the touched `paths`: for ``vllm/<package>/.../<name>.py``, every
    ``tests/<package>/**/test_<name>.py`` in any of `trees` that imports the touched module there
    (vllm/parser/qwen3.py: tests/parser/engine/test_qwen3.py, which imports vllm.parser.qwen3). A test file named
    after it that imports something else tests something else: its run would be minutes of no evidence."""
    found: dict[str, None] = {}
    for tree in trees:
        # file name -> the test files of that name, in ls-tree's order (git's paths are plain: the name is after
        # the last slash; a Path per file cost a warm status ~50 ms at vLLM's few thousand test files)
        by_name: dict[str, list[str]] = {}
        for f in git.files_under(repo, tree, "tests"):
            base = f.rpartition("/")[2]
            if base.startswith("test_") and base.endswith(".py"):
                by_name.setdefault(base, []).append(f)
        named: dict[str, list[str]] = {}  # test file -> the modules it is named after
        for path in paths:
            parts = PurePosixPath(path).parts
            if len(parts) < 2 or parts[0] != "vllm" or not path.endswith(".py"):
                continue
            under = f"tests/{parts[1]}/" if len(parts) > 2 else "tests/"
            name = f"test_{PurePosixPath(path).stem}.py"
            for f in by_name.get(name, ()):
                if f.startswith(under) and f not in found:
                    named.setdefault(f, []).append(_module_of(path))
        texts = git.read_blobs(repo, tree, list(named)) if named else {}
        found.update((f, None) for f, modules in named.items()
                     if any(imports(texts.get(f) or b"", module) for module in modules))
    return tuple(found)


def _module_of(path: str) -> str:
    """vllm/parser/qwen3.py -> vllm.parser.qwen3 (a package's __init__.py: the package)."""
    parts = PurePosixPath(path).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(text: bytes, module: str) -> bool:
    """Whether Python source `text` imports `module` (vllm.parser.qwen3): `import vllm.parser.qwen3`,
    `from vllm.parser.qwen3 import ...`, `from vllm.parser import qwen3` (among others), at any indentation."""
    package, _, name = module.rpartition(".")
    source = text.decode("utf-8", "replace")
    direct = re.compile(rf"^\s*(?:from\s+{re.escape(module)}(?:\.[\w.]+)?\s+import\b|import\s+[^#\n]*"
                        rf"(?<![\w.]){re.escape(module)}(?![\w]))", re.MULTILINE)
    if direct.search(source):
        return True
    if not package:
        return False
    # from vllm.parser import (x, qwen3 as q, ...): the import list, parenthesised over lines or not
    for found in re.finditer(rf"^\s*from\s+{re.escape(package)}\s+import\s+(\([^)]*\)|[^\n]*)", source, re.MULTILINE):
        names = re.sub(r"#[^\n]*", "", found.group(1)).strip("()")
        if any(part.split(" as ")[0].strip() == name for part in names.split(",")):
            return True
    return False


def requirements_for(patch: Patch, probe: Probe | None) -> Requirements | None:
    """The probe venv upstream's tests run in: the probe's own lock, else the series' (probes/requirements.lock);
    None when the series has none (a series of file probes only)."""
    if probe is not None and probe.lock is not None:
        return Requirements.from_lock(probe.lock)
    lock = patch.path.parent / "probes" / LOCK_NAME
    if not lock.is_file():
        return None
    return Requirements.from_lock(lock)


def selection(repo: Path, patch: Patch, *, base: str, patched: str) -> tuple[str, ...]:
    """Upstream's tests of `patch` that `evidence_on` runs: what its probe names (`upstream_tests:`), else the test
    files of the touched modules on `base` or `patched`."""
    probe = probe_for(patch)
    if probe is not None and probe.upstream_tests is not None:
        return tuple(probe.upstream_tests)
    return tests_for(repo, (git.tree_of(repo, base), patched), patch.paths)


def runs_tests(repo: Path, patch: Patch, *, base: str, patched: str) -> bool:
    """Whether `evidence_on` runs processes for `patch` (a selection, and a venv to run it in): a command counting
    its runs ahead (`probe check`, whether a warm interpreter pays) counts these two."""
    return bool(selection(repo, patch, base=base, patched=patched)) and \
        requirements_for(patch, probe_for(patch)) is not None


def evidence_on(repo: Path, patch: Patch, *, base: str, patched: str, ref: str, session: probe_runs.Session,
                use_cache: bool = True, report: Reporter = silent, tests: Sequence[str] | None = None) -> Regressions:
    """Upstream's tests of `patch` on the trees `base` and `patched` (base + the series up to it), in `session`
    (its trees are shared with the probes run there). `tests`: these instead (`vpatch forward`'s own test)."""
    probe = probe_for(patch)
    base_tree = git.tree_of(repo, base)
    tests = selection(repo, patch, base=base, patched=patched) if tests is None else tuple(tests)
    if not tests:
        return Regressions(patch.filename, ref, (), None, None)
    requirements = requirements_for(patch, probe)
    if requirements is None:
        # Said on every answer, never a refusal: without a venv there is no evidence either way, and the
        # decision rests on the probe alone, as it did before upstream's tests were evidence.
        return Regressions(patch.filename, ref, tests, None, None,
                           unavailable=f"no probe venv to run them in (add patches/probes/{LOCK_NAME} with pytest "
                                       "to run them, or `upstream_tests: []` in the patch's probe to run none)")
    try:
        python = probe_venv(requirements, cache=session.cache, report=report)
    except EnvError as exc:
        raise RegressionError(f"{patch.filename}: the probe venv for upstream's tests: {exc.message}",
                              hint=exc.hint) from exc
    key = requirements.key()
    if not (use_cache and all(_entry(session.cache, key, tree, tests, FILE_DEADLINE_S).is_file()
                              for tree in (base_tree, patched))):
        # beside the runs, which go fresh until it is warm; not where both sides are cached answers (a warm status),
        # for it would import the venv's modules for no run (a run that finds an entry unreadable starts it then)
        session.warm_up(python, report)
    if probe is not None and probe.upstream_tests:
        # what a probe names is checked where it must hold, the base tree: a typo is no evidence either way
        absent = [t for t in tests if not any(git.read_blobs(repo, tree, [t.split("::", 1)[0]])[t.split("::", 1)[0]]
                                              is not None for tree in (base_tree, patched))]
        if absent:
            raise RegressionError(f"{probe.path.name}: upstream_tests: {absent[0]}: no such file on {ref}"
                                  f" nor with {patch.filename}",
                                  hint="name a test file of the tree (tests/...py) or a node id in one")
    found = _both(repo, patch.filename, ref, tests, base_tree, patched, python, key, session,
                  use_cache, report, patch.name[:4])
    if probe is not None and probe.upstream_tests and found.base is not None and found.base.missing:
        raise RegressionError(f"{probe.path.name}: upstream_tests: {found.base.missing[0]}: names no test on {ref}"
                              + (f" (and {len(found.base.missing) - 1} more)" if len(found.base.missing) > 1 else ""),
                              hint=f"list the tests there: pytest --collect-only -q {found.base.missing[0].split('::')[0]}"
                                   " (in the tree); name one of them, or the file")
    return found


def venv_tool(patch: Patch, name: str, *, cache: Path | None, report: Reporter = silent) -> Path | None:
    """The program `name` of the probe venv upstream's tests of `patch` run in (`bin/ruff`), None when that venv
    does not have it or there is no venv."""
    requirements = requirements_for(patch, probe_for(patch))
    if requirements is None:
        return None
    try:
        python = probe_venv(requirements, cache=cache, report=report)
    except EnvError as exc:
        raise RegressionError(f"{patch.filename}: the probe venv: {exc.message}", hint=exc.hint) from exc
    tool = python.parent / name
    return tool if tool.is_file() else None


def _both(repo: Path, patch_file: str, ref: str, tests: tuple[str, ...], base: str, patched: str, python: Path,
          key: str, session: probe_runs.Session, use_cache: bool, report: Reporter, label: str) -> Regressions:
    sides = [(base, f"upstream tests of {label} on {ref}"), (patched, f"upstream tests of {label} on {ref} with it")]
    runs = session.map(lambda side, cancel: run_tests(repo, side[0], tests, python=python, venv_key=key,
                                                      session=session, use_cache=use_cache, report=report,
                                                      subject=side[1]), sides)
    before, after = runs
    return Regressions(patch_file, ref, tests, before, after)


def run_tests(repo: Path, tree: str, tests: Sequence[str], *, python: Path, venv_key: str,
              session: probe_runs.Session, use_cache: bool = True, report: Reporter = silent,
              subject: str = "upstream tests", deadline: float | None = None) -> TestRun:
    """`tests` with pytest on `tree`, one run per top folder of tests/ (its own --confcutdir), or the cache's
    answer; `deadline`: each test file's, in seconds (None: FILE_DEADLINE_S). A run that could not start or ended
    without a report is not cached (the next command tries again)."""
    deadline = FILE_DEADLINE_S if deadline is None else deadline
    entry = _entry(session.cache, venv_key, tree, tests, deadline)
    if use_cache:
        try:
            return TestRun.from_json(json.loads(entry.read_bytes()))
        except (OSError, ValueError, KeyError, TypeError):
            pass
    running = probe_runs.Running(report, subject, f"{len(tests)} test file(s)")
    root = running.tree(session, repo, tree)
    results: dict[str, str] = {}
    needs: dict[str, str] = {}
    unnamed: list[str] = []  # ids that name no test
    details: list[str] = []
    ran = True
    for folder, group in _by_folder(tests, root).items():
        found, detail, ok = _pytest(root, folder, group, python, deadline, session, running, report)
        results.update(found.results)
        needs.update(found.needs)
        unnamed += found.missing
        details.append(detail)
        ran = ran and ok
    results.update((test, NOT_RUN) for test in needs)
    missing = [t for t in tests if not (root / t.split("::", 1)[0]).is_file()]
    if missing:
        details.append(f"not in this tree: {', '.join(missing)}")
    run = TestRun(tree, tuple(tests), tuple(sorted(results.items())), round(running.seconds, 3),
                  "; ".join(d for d in details if d), ran, needs=tuple(sorted(needs.items())), missing=tuple(unnamed))
    report(Event(subject, summary(run) if ran else "could not run", final=True, seconds=run.seconds))
    if ran:
        atomic_write(entry, json.dumps(run.to_json(), indent=1).encode() + b"\n")
    return run


def summary(run: TestRun) -> str:
    """'214 passed, 2 failed': the counts of one run."""
    counts = [(run.count(s), s) for s in (PASSED, FAILED, ERROR, SKIPPED, NOT_RUN)]
    return ", ".join(f"{n} {s}" for n, s in counts if n) or "no tests"


def _entry(cache: Path | None, venv_key: str, tree: str, tests: Sequence[str], deadline: float) -> Path:
    # the deadline too: what ran past one is not run here, and may run under another
    digest = hashlib.sha256(_RUNNER + b"\0" + "\0".join(tests).encode() + f"\0{deadline:g}".encode()).hexdigest()[:16]
    return (cache_dir() if cache is None else cache) / RESULTS / venv_key / f"{tree}-{digest}.json"


def _by_folder(tests: Sequence[str], root: Path) -> dict[str, list[str]]:
    """The tests present in the tree, grouped by their folder right under tests/ (each group its --confcutdir)."""
    groups: dict[str, list[str]] = {}
    for test in tests:
        file = test.split("::", 1)[0]
        if not (root / file).is_file():
            continue
        parts = PurePosixPath(file).parts
        folder = "/".join(parts[:2]) if len(parts) > 2 else parts[0]
        groups.setdefault(folder, []).append(test)
    return groups


@dataclass(frozen=True)
class _Found:
    """What one pytest run found: each test's outcome, what each test not run here needed, the ids that named none."""

    results: dict[str, str]
    needs: dict[str, str]
    missing: list[str]


def _pytest(root: Path, folder: str, tests: list[str], python: Path, deadline: float,
            session: probe_runs.Session, running: probe_runs.Running,
            report: Reporter = silent) -> tuple[_Found, str, bool]:
    """One pytest run: what it found, pytest's last line, and whether it ran to its report."""
    # pytest compares --confcutdir with the conftest files' real paths: a tree reached through a symlink (a cache
    # folder linked to another disk) would load vLLM's root conftest
    root = root.resolve()
    nothing = _Found({}, {}, [])
    files = list(dict.fromkeys(t.split("::", 1)[0] for t in tests))
    with tempfile.TemporaryDirectory(prefix="vpatch-upstream-tests-") as scratch:
        report_file, needs_file, control = (Path(scratch) / name for name in ("junit.xml", "needs.json", "run.json"))
        # -p no:cacheprovider and PYTHONDONTWRITEBYTECODE: nothing is written into the tree, which probes share.
        # --continue-on-collection-errors: a test file that no longer imports is its own error, not the run's.
        # The files go to pytest whole; the runner keeps the node ids asked for and names those that match none.
        args = ["-q", "-p", "no:cacheprovider", "-o", "addopts=", "--rootdir", str(root), "--confcutdir",
                str(root / folder), "--continue-on-collection-errors", "--junitxml", str(report_file), *files]
        control.write_text(json.dumps({"args": args, "select": tests, "deadline": deadline,
                                       "report": str(needs_file)}), encoding="utf-8")
        argv = [str(python), str(UPSTREAM_TESTS), str(control)]
        timeout = deadline * len(files) + START_S
        # HOME the session's (run_env), not the user's: the same in the warm interpreter and in a fresh process
        # PYTHONPATH the tree, then what vpatch was given (as the probes have it)
        env = session.run_env({"PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", ""))
                                                               if p)})
        with running.place(session):  # one of the session's --jobs processes, whatever else runs beside (the probe's)
            ran = _in_zygote(argv, root, env, python, timeout, session, report)
            if ran is None:
                try:
                    proc = run_process(argv, cwd=root, env=env, check=False, merge_output=True,
                                       timeout=timeout, own_group=True, cancel=session.cancel)
                except ProcessError as exc:
                    return nothing, exc.message, False
                ran = (proc.returncode, proc.stdout)
        if isinstance(ran, str):
            return nothing, ran, False
        returncode, stdout = ran
        output = stdout.decode("utf-8", "replace").strip()
        last = output.splitlines()[-1] if output else f"pytest exited {returncode} without output"
        if returncode not in (0, 1, 5) or not report_file.is_file():
            # 2 interrupted, 3 internal error, 4 usage error: no evidence either way (5, none collected: the
            # ids asked for named none, said below)
            return nothing, f"pytest exited {returncode}: {last}", False
        try:
            said = json.loads(needs_file.read_bytes())
            needs = {str(n): str(w) for n, w in said["not_run"].items()}
            missing = [str(n) for n in said["missing"] if "::" in str(n)]  # a whole file may fail to collect
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return nothing, f"the test runner left no report of what it could not run: {last}", False
        return _Found(_read_junit(report_file, tests), needs, missing), _without_warnings(last), True


def _without_warnings(last: str) -> str:
    """pytest's last line without its count of warnings ("11 failed, 199 passed, 14 warnings in 2.20s" -> "11
    failed, 199 passed in 2.20s"). A warning is shown once per interpreter: a module that warns as it is imported
    (torch.jit's script_method, 14 times for the parser tests of v0.33.0) warns in a fresh run, but in the warm
    interpreter before the run, which then shows none; and pytest warns of a plugin imported before it starts
    (anyio's, imported there for httpx) only in the warm one. The count says how the run was made, never what the
    tree does."""
    counts, sep, rest = last.partition(" in ")
    kept = [part for part in counts.split(", ") if not re.fullmatch(r"\d+ warnings?", part)]
    return ", ".join(kept) + sep + rest if kept else last


def _in_zygote(argv: list[str], root: Path, env: dict[str, str], python: Path, timeout: float,
               session: probe_runs.Session, report: Reporter) -> tuple[int, bytes] | str | None:
    """One pytest run in the session's warm interpreter of the venv (pytest, torch and what the tests import
    imported once; vllm and the tests from the tree in each run): its exit code and output, why it could not end
    (a string), or None where it runs fresh (no zygote, or the zygote could not run it to the end)."""
    zygote = session.zygote_for(python, report)
    if zygote is None or not zygote.fits(argv, env):
        return None
    ran = zygote.run(argv, cwd=root, env=env, timeout=timeout, cancel=session.cancel)
    if ran is None:
        return None
    if ran.cancelled:
        return "the run was cancelled"
    if ran.timed_out:
        return f"pytest timed out after {timeout:g}s"
    return ran.returncode, ran.output


def _read_junit(path: Path, tests: Sequence[str]) -> dict[str, str]:
    """Node id -> outcome from pytest's JUnit XML (a collection error is its file's own entry)."""
    modules = {t.split("::", 1)[0][:-3].replace("/", "."): t.split("::", 1)[0] for t in tests}
    found: dict[str, str] = {}
    for case in ElementTree.parse(path).iter("testcase"):  # pytest's own report, written just now
        classname, name = case.get("classname", ""), case.get("name", "")
        node = _node_id(classname, name, modules)
        status = PASSED
        for child in case:
            if child.tag in ("failure", "error"):
                status = FAILED if child.tag == "failure" else ERROR
                break
            if child.tag == "skipped":
                status = SKIPPED
        # a test that passed and then errored in its teardown has two entries: the worse one stands
        if found.get(node) in (FAILED, ERROR) and status in (PASSED, SKIPPED):
            continue
        found[node] = status
    return found


def _node_id(classname: str, name: str, modules: dict[str, str]) -> str:
    """pytest's node id from JUnit's dotted classname: tests.a.test_b.TestC + name -> tests/a/test_b.py::TestC::name."""
    if not classname:  # a collection error: its name is the module
        return modules.get(name, name.replace(".", "/") + ".py")
    for module, file in sorted(modules.items(), key=lambda m: -len(m[0])):
        if classname == module or classname.startswith(module + "."):
            inner = classname[len(module) + 1:].replace(".", "::")
            return f"{file}::{inner}::{name}" if inner else f"{file}::{name}"
    return f"{classname}::{name}"
