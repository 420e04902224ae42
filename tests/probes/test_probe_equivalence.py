"""Equivalence of the probe workspace with the way probes ran before it, on the real release history. The new way
(one workspace, trees shared, runs in parallel, each a child of the probe venv's warm interpreter) runs every
shipped probe on every release v0.28.0 ... v0.33.0, without and with its patch (where it applies); the old way
(its own extraction, the probe started directly) runs each command probe on two of those trees, the first the new
way failed on and the first it passed on (both verdicts, a tree without and one with the fix, for every command
probe), and each files probe on the oldest and the newest release, without and with the patch; each pair must
give the same outcome and the same output lines. The new way writes the user's result cache, so the shipped-series
tests after it read these results instead of running the probes again: the test's own cost is the old way's fresh
runs (2026-12-06: 244 s for all 31 runs, the longest test of the suite; 2026-12-07: four fresh command runs, where
the oldest and the newest release took nine)."""

from __future__ import annotations

import os
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import REAL_CACHE, RELEASE_VERSIONS

from vpatch import git
from vpatch.base import process
from vpatch.base.errors import ProcessError
from vpatch.base.progress import Event
from vpatch.probes import runner as probes
from vpatch.probes import workspace as probe_runs
from vpatch.probes.env import probe_venv
from vpatch.probes.file import Probe, probe_for
from vpatch.probes.outcome import ProbeKind, ProbeOutcome, Ran, argv, interpret
from vpatch.series.files import Series

pytestmark = pytest.mark.releases

PATCHES = Path(__file__).resolve().parents[2] / "patches"
# Lines that say when or how long differ from run to run: vLLM's log lines carry a timestamp ("WARNING 12-01
# 21:53:50 [...]"); a duration ("1.2s") would too.
TIMING = re.compile(r"\b\d\d:\d\d:\d\d\b|\b\d+(\.\d+)?\s?(s|ms|seconds)\b")
WORKSPACE_TREE = re.compile(r"\S*/probe-runs/run-\d+-[^/]+/[0-9a-f]{40}/tree")
# the releases the old way runs a files probe on: the oldest and the newest
OLD_WAY_RELEASES = (RELEASE_VERSIONS[0], RELEASE_VERSIONS[-1])


def old_way(repo: Path, probe: Probe, tree: str) -> tuple[ProbeOutcome, str]:
    """How a command probe ran before the workspace: a tree of its own, the probe's process started directly."""
    if probe.kind is ProbeKind.FILES:
        return interpret(probe, probes.tree_place(repo, tree, None))
    python = probe_venv(probe.environment(), cache=REAL_CACHE)
    with tempfile.TemporaryDirectory(prefix="old-way-") as tmp:
        root = Path(tmp) / "tree"
        git.extract_tree(repo, tree, root)
        command = argv(probe, python=str(python), probe_dir=str(probe.path.parent.resolve()), tree=str(root))
        env = {"PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p),
               "PYTHONDONTWRITEBYTECODE": "1"}

        def run(probe: Probe) -> Ran:
            try:
                proc = process.run(command, cwd=root, env=env, check=False, merge_output=True, timeout=probe.timeout,
                                   own_group=True)
            except ProcessError as exc:
                return Ran(124, exc.output.encode(), timed_out=True) if exc.timed_out else Ran(-1, b"", exc.message)
            return Ran(proc.returncode, proc.stdout)

        outcome, detail = interpret(probe, probes.tree_place(repo, tree, None, run))
        return outcome, detail.replace(str(root), "<tree>")


def lines(detail: str) -> list[str]:
    return [line for line in detail.splitlines() if not TIMING.search(line)]


def test_the_workspace_gives_what_a_fresh_extraction_and_process_gave(release_history: Path) -> None:
    patches = list(Series.load(PATCHES))
    cases: list[tuple[str, Probe, str, str]] = []  # (what, probe, tree, release)
    skipped = []
    for patch in patches:
        probe = probe_for(patch)
        assert probe is not None
        for version in RELEASE_VERSIONS:
            tag = f"v{version}"
            cases.append((f"{patch.name} on {tag}", probe, git.tree_of(release_history, tag), version))
            # the patch alone, as validate_probe applies it (and test_shipped_series reads the cached result)
            patched = git.tree_with_patch(release_history, tag, patch.raw)
            if patched is None:
                skipped.append(f"{patch.name} on {tag}")  # it does not apply there: nothing to run
            else:
                cases.append((f"{patch.name} on {tag} with the patch", probe, patched, version))
    assert len(cases) >= 2 * len(RELEASE_VERSIONS) * len(patches) - len(skipped)

    # the new way: one workspace, every run ahead and in parallel, each a fork of the probe venv's warm interpreter
    # (probes/zygote.py), then read in order (and cached, for later tests)
    events: list[Event] = []
    with probe_runs.Session(cache=REAL_CACHE, zygote=True, report=events.append) as session:
        # warm before the runs (a command's first runs go fresh while it starts)
        command = next(probe for _, probe, _, _ in cases if probe.kind is ProbeKind.COMMAND)
        venv = probe_venv(command.environment(), cache=REAL_CACHE)
        assert session.zygote_for(venv, wait=True) is not None
        requests = [probes.ProbeRequest(probe, tree, what) for what, probe, tree, _ in cases]
        probes.run_ahead(release_history, requests, session, use_cache=False)
        new = [probes.run_probe(release_history, r.probe, r.treeish, use_cache=False, session=session)
               for r in requests]
        zygotes = session.zygotes()
    # every command run went through the zygote, or fresh while it learned (no run waits for that): none fell back
    commands = len({(probe.path, tree) for _, probe, tree, _ in cases if probe.kind is ProbeKind.COMMAND})
    assert [z.broken for z in zygotes] == [None], events
    assert zygotes[0].runs + zygotes[0].went_fresh == commands and zygotes[0].runs > 0, (events, commands)

    # the old way on those trees, two at a time (each run is what it was: its own tree, its own process)
    compared: list[tuple[tuple[str, Probe, str, str], probes.ProbeResult]] = []
    for case, result in zip(cases, new):
        probe = case[1]
        if probe.kind is ProbeKind.FILES:
            if case[3] in OLD_WAY_RELEASES:
                compared.append((case, result))
        elif result.outcome not in {r.outcome for (c, r) in compared if c[1].path == probe.path}:
            compared.append((case, result))  # the first tree it failed on, the first it passed on (or errored on)
    assert {probe.path for (_, probe, _, _), _ in compared} == {probe_for(p).path for p in patches}  # every probe
    with ThreadPoolExecutor(max_workers=max(1, probe_runs.default_jobs())) as pool:
        old = list(pool.map(lambda pair: old_way(release_history, pair[0][1], pair[0][2]), compared))

    differ = []
    for ((what, _, _, _), result), (old_outcome, old_detail) in zip(compared, old):
        new_lines = [WORKSPACE_TREE.sub("<tree>", line) for line in lines(result.detail)]
        if (old_outcome, lines(old_detail)) != (result.outcome, new_lines):
            differ.append(f"{what}: old {old_outcome.value} {lines(old_detail)[-3:]} / new {result.outcome.value} "
                          f"{new_lines[-3:]}")
    assert not differ, "\n".join(differ)
    # both ways decided each command probe both ways: the comparison is of verdicts, not of two errors
    for path in {probe.path for (_, probe, _, _), _ in compared if probe.kind is ProbeKind.COMMAND}:
        decided = sorted(r.outcome.value for ((_, probe, _, _), r) in compared if probe.path == path)
        assert decided == ["fail", "pass"], (path.name, decided)
