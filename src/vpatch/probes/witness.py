"""The one door to a patch's behavioural evidence: "what does patch P's evidence say on commit C", asked in one place.

A command builds one `Witness` and hands it to what asks (status and update judging, `probe check`, update's
re-validation):

    with probes.Witness(repo, config, report=view, jobs=jobs) as evidence:
        report = status.compute_status(repo, patches, pin=pin, targets=targets, ..., evidence=evidence)

It runs the probes (ahead of the order that reads them, in parallel, through the warm interpreter of the
session it opens), answers from the result cache, counts runs, cache hits and errors, and validates a probe
against the pin through one rule in one wording (runner.validation's: it fails on the pin and passes with the
series up to its patch; update and `probe check` ask the same). A probe that does not validate on the pin is
INVALID on every commit: never evidence.

A new kind of evidence (upstream's own tests, per-hunk coverage) plugs in here and nowhere else: its own module
under probes/ runs it; the Witness gains one method that answers it for (patch, commit) with the cache, the
counts and the run-ahead of the session it holds, and one field on the answer the verdict reads
(`ProbeCheck` today holds the probe's); verdict/judge.py gives it its weight. status and update then need no
change: they hand the Witness on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from vpatch import git, upstream
from vpatch.base import Reporter, VpatchError, silent
from vpatch.probes import regression, runner
from vpatch.probes.file import Probe, ProbeError
from vpatch.probes.follow import Moved, follow_strings
from vpatch.probes.outcome import ProbeOutcome
from vpatch.probes.workspace import Session

if TYPE_CHECKING:
    from typing import Self

    from vpatch.config import Config
    from vpatch.series import Patch


@dataclass(frozen=True)
class ProbeCheck:
    """A probe's answer for one tree, as the Witness hands it to the verdict."""

    outcome: ProbeOutcome
    detail: str = ""
    ran: bool = True  # False: answered from the result cache
    invalid: bool = False  # the probe does not validate on the pin (see Witness.says): never evidence
    # On the pin only: upstream's own tests of the files the patch touches, without and with the series up to it
    # (probes/regression.py). `regressions`: those that pass without and not with it; `tests`: what they said.
    regressions: tuple[str, ...] = ()
    tests: str = ""
    # A files probe run where its patch's code went on this commit (probes/follow.py): what followed, in words
    # ("vllm/a.py -> vllm/b.py, its strings followed hunk 1"); `unfollowed`: an ERROR because a check could not
    # follow (a string none of the patch's hunks holds), `detail` says which and what to do.
    followed: tuple[str, ...] = ()
    unfollowed: bool = False


# (patch as written on the pin, commit, where its hunks' code moved to another file there) -> the probe's answer
# on that unpatched commit; None when the patch has no probe.
ProbeFn = Callable[["Patch", str, Moved], "ProbeCheck | None"]


@dataclass(frozen=True)
class Tally:
    """How many probe answers ran, came from the result cache, or could not decide (never counted as run)."""

    ran: int = 0
    cached: int = 0
    errors: int = 0

    def since(self, before: Tally) -> Tally:
        return Tally(self.ran - before.ran, self.cached - before.cached, self.errors - before.errors)


# (tree or commit, the patch's sha256) -> the tree it becomes with the patch applied (None: it does not apply)
Steps = dict[tuple[str, str], "str | None"]


def stacked_tree(repo: Path, patches: Sequence[Patch], base: str, upto: Patch, *, name: str | None = None,
                 steps: Steps | None = None) -> str:
    """The tree of `base` with the series applied in order up to and including `upto`: the tree `vpatch apply`
    commits for it. Raises ProbeError naming the patch that does not apply. `steps`: each patch applied on a tree
    so far, read and kept, so that the stacks of one series share their prefixes (a step is one temporary index
    loaded with the whole tree: a Witness keeps them for its command, where the run-ahead and the validation on the
    pin ask for the same stacks). Sound for one repository: a tree with a patch applied is the same tree each time."""
    tree = base
    for patch in patches:
        step = (tree, patch.sha256)
        if steps is not None and step in steps:
            applied = steps[step]
        else:
            applied = git.tree_with_patch(repo, tree, patch.raw)
            if steps is not None:
                steps[step] = applied
        if applied is None:
            raise ProbeError(f"{patch.filename} does not apply on {name or base[:12]} after the patches before it, "
                             f"so the probe of {upto.filename} cannot be checked with its patch",
                             hint=f"vpatch apply --ref {name or base[:12]} names the failing hunk")
        tree = applied
        if patch.filename == upto.filename:
            return tree
    raise ProbeError(f"{upto.filename} is not in the series", hint="vpatch status lists the patches")


class Witness:
    """What a patch's evidence says on a commit (see the module docstring).

    `repo`: the upstream repository (None: the project's, opened when first needed, so that a command that builds
    its Witness first still says first what else is wrong).
    `names`: commit -> the ref that names it in progress lines. `jobs`: the runs at once of the session `with`
    opens (default: the cores), `zygote` whether they go through a warm interpreter (default:
    workspace.zygote_default); outside a `with` each run goes alone."""

    def __init__(self, repo: Path | None, config: Config | None = None, *, cache: Path | None = None,
                 report: Reporter | None = None, names: Mapping[str, str] | None = None, jobs: int | None = None,
                 zygote: bool | None = None) -> None:
        self._repo, self.config, self.cache, self.jobs, self.zygote = repo, config, cache, jobs, zygote
        self.report = report or silent
        self.names: dict[str, str] = dict(names or {})
        self.session: Session | None = None
        self.tally = Tally()
        self._loaded: dict[Path, Probe] = {}
        self._followed: dict[bytes, Probe] = {}
        self._base: list[str | None] = []  # the pin, where the probes' paths are named (moves are followed from there)
        self._steps: Steps = {}  # stacked_tree's, for this Witness's repo

    @property
    def repo(self) -> Path:
        if self._repo is None:
            assert self.config is not None, "a Witness needs a repo or a config"
            self._repo = upstream.open_upstream(self.config)
        return self._repo

    def __enter__(self) -> Self:
        self.session = Session(cache=self.cache, jobs=self.jobs, zygote=self.zygote).__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        session, self.session = self.session, None
        if session is not None:
            session.__exit__(kind, exc, tb)

    # --- the verdict's question: the probe's answer on an unpatched commit, validated on the pin ---------------

    def asking(self, pin: str, series: Sequence[Patch]) -> ProbeFn:
        """The question the verdict asks, (patch, commit, moved) -> `says`, for one judging of `series` against
        `pin` (its validations on the pin are made once, for this judging)."""
        vetted: dict[str, tuple[ProbeCheck | None, ProbeCheck | None]] = {}
        return functools.partial(self.says, pin=pin, series=series, vetted=vetted)

    def says(self, patch: Patch, commit: str, moved: Moved | None = None, *, pin: str, series: Sequence[Patch],
             vetted: dict[str, tuple[ProbeCheck | None, ProbeCheck | None]] | None = None) -> ProbeCheck | None:
        """The patch's probe on the unpatched `commit`: INVALID on every commit where it does not validate on the pin
        (runner.validation: it fails there and passes on the pin plus `series` up to its patch). One that passes on
        the pin is vacuous or landed on its own pin; one that still fails with the patch never passes; one that
        errors there, or checks a file that is on neither side, decides nothing. None: the patch has no probe.
        `moved`: where the patch's hunks' code went to another file on `commit` (the verdict's hunk moves), which a
        files probe follows (`answer`)."""
        vetted = {} if vetted is None else vetted
        if patch.filename not in vetted:
            vetted[patch.filename] = self._vet(patch, pin, series)
        at_pin, invalid = vetted[patch.filename]
        if invalid is not None:
            return invalid
        return at_pin if commit == pin else self.answer(patch, commit, moved)

    def answer(self, patch: Patch, commit: str, moved: Moved | None = None) -> ProbeCheck | None:
        """The patch's probe on the tree `commit` as it is (no validation), counted. `moved`: (a path of the pin,
        hunk number) -> the file its code is in on `commit`; a files probe's checks on such a path follow the
        code there (probes/follow.py), and the answer says so."""
        check = self._run(patch, commit, moved or {})
        if check is not None:
            self._count(check)
        return check

    def name(self, commits: Mapping[str, str]) -> None:
        """Name these commits (commit -> ref) in progress lines from now on."""
        self.names.update(commits)

    def ahead(self, pin: str, series: Sequence[Patch], commits: Sequence[str]) -> None:
        """Run, in parallel, the command probes that the questions of a judging will ask, and only those: each
        probe on the pin; where it fails there, on the pin plus the series up to its patch; where it passes there,
        on every other commit. The questions then read the results in the verdicts' order."""
        if self.session is None:
            return
        probed = [p for p in series if p.probe_path is not None]
        at_pin = self._ahead([(p, pin) for p in probed])
        sides = []
        for patch, outcome in zip(probed, at_pin):
            if outcome is ProbeOutcome.FAIL:
                try:
                    sides.append((patch, stacked_tree(self.repo, series, pin, patch, steps=self._steps)))
                except VpatchError:
                    pass  # _vet says why
        valid = {p.filename for (p, _), outcome in zip(sides, self._ahead(sides)) if outcome is ProbeOutcome.PASS}
        self._ahead([(p, c) for c in commits if c != pin for p in probed if p.filename in valid])

    # --- a probe checked on both sides (update, probe check): runner.validation's rule -------------------------

    def validation(self, probe: Probe, patch_file: str, *, base: str, patched: str, base_name: str | None = None,
                   use_cache: bool = True, moves_from: str | None = None) -> runner.Validation:
        """The probe on `base` (it must FAIL) and on `patched` (it must PASS), the two sides at once where the
        session allows: runner.validation, in this Witness's session."""
        return runner.validation(self.repo, probe, patch_file, base=base, patched=patched, base_name=base_name,
                                 cache=self.cache, report=self.report, use_cache=use_cache, moves_from=moves_from,
                                 session=self.session)

    def validate(self, patch: Patch, *, base: str, patched: str | None = None,
                 repo: Path | None = None) -> runner.Validation:
        """The patch's probe validated on `base` and `patched` (default: `base` + the patch); raises ProbeError
        when the patch has no probe or the probe does not tell the two apart (runner.validate_probe), and when the
        patch breaks one of upstream's own tests there (a patch carried or resolved by hand: a decision rests on
        it). `repo`: where the two trees are, when not this Witness's (an update resumed from its recorded
        upstream)."""
        where = repo or self.repo
        try:
            checked = runner.validate_probe(where, self.config, patch, base=base, patched=patched,
                                            cache=self.cache, report=self.report, session=self.session)
        except ProbeError as exc:
            checked, refused = None, exc
        with_patch = patched if patched is not None else git.tree_with_patch(where, base, patch.raw)
        if with_patch is not None:
            name = self.names.get(base) or git.tag_at(where, base) or base[:12]
            found = self.regressions(patch, base=base, patched=with_patch, ref=name, repo=where)
            if found.regressed:
                # upstream's tests name what the patch breaks, which a probe of the bug alone cannot
                raise ProbeError(f"{patch.filename} breaks upstream's own tests on {name}: "
                                 f"{', '.join(found.regressed)} (they pass without the patch and fail with it)"
                                 + ("" if checked is not None else f"; and {refused.message}"),
                                 hint="change the patch so that they pass with it (they are upstream's evidence of "
                                      "what must keep working), or drop what breaks them")
        if checked is None:
            raise refused
        return checked

    # --- evidence the other way: upstream's own tests of what the patch touches --------------------------------

    def regressions(self, patch: Patch, *, base: str, patched: str, ref: str, use_cache: bool = True,
                    repo: Path | None = None, tests: Sequence[str] | None = None) -> regression.Regressions:
        """Upstream's tests of the files `patch` touches on `base` and on `patched` (probes/regression.py), in this
        Witness's session (the trees its probes use), cached per tree; `repo` as for validate; `tests`: these
        test files instead (the patch's own test, `vpatch forward`)."""
        where = repo or self.repo
        if self.session is None:
            with Session(cache=self.cache, jobs=self.jobs, zygote=False) as own:
                return regression.evidence_on(where, patch, base=base, patched=patched, ref=ref, session=own,
                                              report=self.report, use_cache=use_cache, tests=tests)
        return regression.evidence_on(where, patch, base=base, patched=patched, ref=ref, session=self.session,
                                      report=self.report, use_cache=use_cache, tests=tests)

    def venv_tool(self, patch: Patch, name: str) -> Path | None:
        """The program `name` in the probe venv upstream's tests of `patch` run in; None when it has none."""
        return regression.venv_tool(patch, name, cache=self.cache, report=self.report)

    # --- inside ---------------------------------------------------------------------------------------------

    def _vet(self, patch: Patch, pin: str, series: Sequence[Patch]) -> tuple[ProbeCheck | None, ProbeCheck | None]:
        """The probe's answer on the pin, and the INVALID check to give instead when it does not validate there:
        runner.validation on the pin and the pin plus the series up to the patch, its rule and its words (update
        and `probe check` say the same of the same probe)."""
        if patch.probe_path is None:
            return None, None
        patched: str | None = None
        why: str | None = None
        try:
            patched = stacked_tree(self.repo, series, pin, patch, steps=self._steps)
            checked = self.validation(self._load(patch.probe_path), patch.filename, base=pin, patched=patched,
                                      base_name=self.names.get(pin, pin[:12]), moves_from=self._moves_from())
        except VpatchError as exc:  # a series that does not stack (nothing ran), a probe that cannot load or run
            at_pin, why = ProbeCheck(ProbeOutcome.ERROR, _last_lines(exc.message)), exc.message
            if patched is not None:
                self._count(at_pin)
        else:
            sides = [self._count(self._check(side)) if side is not None else None
                     for side in (checked.base, checked.patched)]
            at_pin = sides[0] or ProbeCheck(ProbeOutcome.ERROR)
            why = None if checked.ok else "; ".join(filter(None, (checked.detail, checked.hint)))
        # The pin is where a decision rests: upstream's own tests of the touched files, without and with the series,
        # whatever the probe says (a patch that breaks a well-formed case may break its probe too).
        tests = self._pin_tests(patch, pin, patched)
        at_pin = replace(at_pin, regressions=tests.regressions, tests=tests.tests)
        if why is None:
            return at_pin, None
        return at_pin, ProbeCheck(ProbeOutcome.ERROR, why, ran=False, invalid=True, regressions=tests.regressions,
                                  tests=tests.tests)

    def _pin_tests(self, patch: Patch, pin: str, patched: str | None) -> ProbeCheck:
        """Upstream's tests on the pin and the pin + the series up to `patch`, as the fields a ProbeCheck carries."""
        if patched is None:
            return ProbeCheck(ProbeOutcome.ERROR)
        try:
            found = self.regressions(patch, base=pin, patched=patched, ref=self.names.get(pin, pin[:12]))
        except VpatchError as exc:
            return ProbeCheck(ProbeOutcome.ERROR, tests=f"upstream tests could not run: {exc.message}")
        return ProbeCheck(ProbeOutcome.ERROR, regressions=found.regressed, tests=found.says())

    def _moves_from(self) -> str | None:
        if not self._base:
            self._base.append(runner.moves_base(self.repo, self.config))
        return self._base[0]

    def _load(self, path: Path) -> Probe:
        if path not in self._loaded:
            self._loaded[path] = Probe.load(path)
        return self._loaded[path]

    def _read(self, raw: bytes, path: Path) -> Probe:
        """A probe as followed (its text, read as if from `path`), read once per text."""
        if raw not in self._followed:
            self._followed[raw] = Probe.read(raw, path=path)
        return self._followed[raw]

    def _label(self, patch: Patch, commit: str) -> str:
        return f"{patch.name} on {self.names.get(commit, commit[:12])}"

    def _run(self, patch: Patch, commit: str, moved: Moved) -> ProbeCheck | None:
        """Run (or read from the result cache) the patch's probe on `commit`, its checks following the code that
        moved (`moved`); a probe that cannot be loaded, followed or run is an ERROR, which the verdict counts
        neither way."""
        if patch.probe_path is None:
            return None
        try:
            probe = self._load(patch.probe_path)
        except VpatchError as exc:
            return ProbeCheck(ProbeOutcome.ERROR, _last_lines(exc.message))
        try:
            found = follow_strings(probe, patch, moved, name=patch.trailer("Probe") or probe.name) if moved else None
        except VpatchError as exc:
            # where a string is checked now is not guessed: said whole, a person fixes the probe
            return ProbeCheck(ProbeOutcome.ERROR, exc.message + (f"; {exc.hint}" if exc.hint else ""), ran=False,
                              unfollowed=True)
        followed = tuple(str(m) for m in found.moves) if found is not None else ()
        try:
            if found is not None:
                probe = self._read(found.raw, probe.path)
            result = runner.run_probe(self.repo, probe, commit, cache=self.cache,
                                      label=self._label(patch, commit), report=self.report,
                                      moves_from=self._moves_from(), session=self.session)
        except VpatchError as exc:
            return ProbeCheck(ProbeOutcome.ERROR, _last_lines(exc.message), followed=followed)
        return self._check(result, followed)

    @staticmethod
    def _check(result: runner.ProbeResult, followed: tuple[str, ...] = ()) -> ProbeCheck:
        """A probe's result on one tree as the verdict reads it (`followed`: where a files probe's checks went)."""
        return ProbeCheck(result.outcome, _last_lines(result.detail), ran=not result.cached, followed=followed)

    def _count(self, check: ProbeCheck) -> ProbeCheck:
        """Count an answer: it ran, came from the result cache, or could not decide (never counted as run)."""
        ran, cached, errors = self.tally.ran, self.tally.cached, self.tally.errors
        if check.outcome is ProbeOutcome.ERROR:
            errors += 1
        elif check.ran:
            ran += 1
        else:
            cached += 1
        self.tally = Tally(ran, cached, errors)
        return check

    def _ahead(self, pairs: Sequence[tuple[Patch, str]]) -> list[ProbeOutcome | None]:
        """Run the command probes of (patch, commit) `pairs` at once, up to the session's jobs, for the questions
        that ask for them later; their outcomes (None: not run ahead, it runs when asked)."""
        assert self.session is not None
        requests: list[runner.ProbeRequest | None] = []
        for patch, commit in pairs:
            try:
                probe = self._load(patch.probe_path) if patch.probe_path is not None else None
            except VpatchError:
                probe = None  # the question says why
            requests.append(None if probe is None else
                            runner.ProbeRequest(probe, commit, self._label(patch, commit), self._moves_from()))
        try:
            found = runner.run_ahead(self.repo, [r for r in requests if r is not None], self.session,
                                     report=self.report)
        except VpatchError:
            return [None] * len(pairs)  # e.g. a tree that cannot be read: the question in order says so
        results = iter(found)
        return [None if r is None else (lambda got: None if got is None else got.outcome)(next(results))
                for r in requests]


def _last_lines(text: str, lines: int = 2, chars: int = 240) -> str:
    """The end of a probe's output: where a probe prints its conclusion."""
    tail = " | ".join(line.strip() for line in text.strip().splitlines()[-lines:] if line.strip())
    return tail if len(tail) <= chars else "..." + tail[-chars:]
