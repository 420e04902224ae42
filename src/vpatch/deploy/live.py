"""Live checks at deploy and verify time: which ones a candidate owes, sending them, and what they showed.

A candidate owes the live check of every patch its labels name (the fix must show through the server) and
of every patch dropped since the baseline's pin (RETIRED.md keeps the check: the drop said upstream fixed
it, so the new server must show it; when it does not, that is a false-drop alarm).
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vpatch.base import Progress, VpatchError
from vpatch.config import ImageDefinition
from vpatch.deploy.client import Server, ServerError
from vpatch.deploy.judge import CheckResult, CheckStatus
from vpatch.deploy.livecheck import Api, LiveCase, LiveCheck, LiveCheckError
from vpatch.deploy.livejudge import Observed, forced_token_problems, judge
from vpatch.deploy.readings import assemble_chat, sse_events
from vpatch.image import LABEL_PREFIX, verify_image
from vpatch.series import Series, live_check_file, retired_entries
from vpatch.serve import health_url, lint_command, render_command, start, wait_alive

if TYPE_CHECKING:
    from vpatch.config import Config, ServeConfig
    from vpatch.docker import Docker

# The labels `vpatch build` writes (image/plan.py) that say which patches an image holds.
_PATCHES_LABEL = f"{LABEL_PREFIX}.patches"
_PIN_LABEL = f"{LABEL_PREFIX}.pin.ref"


class Role(str, Enum):
    KEPT = "kept"  # a patch in the candidate: its fix must show through the server
    DROPPED = "dropped"  # dropped since the baseline's pin as upstream: upstream's fix must show


@dataclass(frozen=True)
class Planned:
    """One live check a server owes."""

    patch: str  # NNNN-slug
    role: Role
    file: str  # the check's path relative to the project root
    check: LiveCheck
    why: str = ""  # for a dropped patch: where RETIRED.md says upstream has it


@dataclass(frozen=True)
class LivePlan:
    checks: tuple[Planned, ...]
    notes: tuple[str, ...] = ()  # what could not be planned and why (said in the report, never silent)
    verified: str | None = None  # the candidate's `vpatch verify`, one line; None: not a vpatch image


@dataclass(frozen=True)
class CaseOutcome:
    name: str
    problems: tuple[str, ...]
    seen: Observed | None  # None: the request itself failed (the problem says how)
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class PatchOutcome:
    """One patch's live check on one server."""

    planned: Planned
    cases: tuple[CaseOutcome, ...]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.cases)

    @property
    def false_drop(self) -> bool:
        """A patch dropped as upstream whose check fails on the new server: upstream does not fix it there."""
        return self.planned.role is Role.DROPPED and not self.ok

    @property
    def label(self) -> str:
        return f"live {self.planned.patch} ({self.planned.role.value})"

    def as_check(self) -> CheckResult:
        seconds = sum(c.seconds for c in self.cases)
        passed = sum(c.ok for c in self.cases)
        figure = f"{passed} of {len(self.cases)} case(s) as expected ({self.planned.file})"
        failed = [c for c in self.cases if not c.ok]
        # The first failing case; every case is in the live-check table and the JSON.
        detail = f"{failed[0].name}: {'; '.join(failed[0].problems)}" if failed else ""
        if len(failed) > 1:
            detail += f" (and {len(failed) - 1} more case(s))"
        if self.false_drop:
            figure = f"FALSE DROP: {figure}"
            detail = (f"{self.planned.patch} was dropped as upstream ({self.planned.why}), but this server still "
                      f"shows the bug: {detail}")
        return CheckResult(self.label, CheckStatus.PASS if self.ok else CheckStatus.FAIL, figure, detail, seconds)


@dataclass(frozen=True)
class LiveReport:
    """What a deploy's live checks showed, per patch, on the candidate and (report only) the baseline."""

    plan: LivePlan
    candidate: tuple[PatchOutcome, ...]
    baseline: tuple[PatchOutcome, ...] = ()

    @property
    def alarms(self) -> list[str]:
        return alarms(self.candidate)


def plan_live(config: Config, *, candidate: str, baseline: str | None, serve: ServeConfig, docker: Docker,
              progress: Progress, verify: bool = True) -> LivePlan:
    """The live checks `candidate` owes, with `baseline` the image production runs now (None: nothing runs).

    A candidate built by vpatch is verified first (`vpatch verify`): one whose files do not match its labels
    is refused here, before anything is touched. A check the serve configuration cannot satisfy (say it
    needs the qwen3_coder tool parser) is refused here too.
    """

    cand_labels = docker.image(candidate).labels
    kept_names = _labelled(cand_labels)
    notes: list[str] = []
    verified: str | None = None
    if kept_names is None:
        notes.append(f"{candidate} carries no vpatch labels (not made by `vpatch build`): not verified, no kept "
                     "patch to check")
        kept_names = ()
    elif verify:
        verified = _verify(config, candidate, docker, progress)
    planned: list[Planned] = []
    # The series is read only when the candidate names patches (a project may deploy the official image).
    by_name = {p.name: p for p in Series.load(config.patches_dir)} if kept_names else {}
    for name in kept_names:
        patch = by_name.get(name)
        if patch is None:  # verify refuses this; without verify it is said, not skipped silently
            notes.append(f"{name} is in the candidate's labels but not in the project's series")
            continue
        path = patch.live_check_path(config.root)
        if path is None:
            notes.append(f"{name}: no Live-Check")
            continue
        planned.append(Planned(name, Role.KEPT, patch.live_check or "", _load(path, config.root)))
    if baseline is not None:
        base_names = _labelled(docker.image(baseline).labels)
        if base_names is None:
            notes.append(f"the baseline {baseline} carries no vpatch labels: which patches were dropped since its "
                         "pin is not known")
        else:
            retired = retired_entries(config.patches_dir)
            for name in base_names:
                if name in kept_names:
                    continue
                entry = retired.get(int(name[:4])) if name[:4].isdigit() else None
                if entry is None:
                    notes.append(f"{name} is in the baseline but neither in the candidate nor in RETIRED.md")
                elif entry.live_check is None:
                    notes.append(f"{name} was dropped ({entry.retired_by}) with no Live-Check kept")
                else:
                    path = live_check_file(config.root, entry.live_check, where=f"RETIRED.md entry {entry.name}")
                    why = f"Applied-Upstream: {entry.applied_upstream}; {entry.retired_by}"
                    planned.append(Planned(name, Role.DROPPED, entry.live_check, _load(path, config.root), why))
    for item in planned:
        mismatch = item.check.serve_mismatches(serve)
        if mismatch:
            raise VpatchError(f"the live check of {item.patch} ({item.file}) cannot run on this server: "
                              + "; ".join(mismatch),
                              hint="set those keys in the serve: section of the image definition, or fix the "
                              "check's serve: section; nothing was touched")
    return LivePlan(tuple(planned), tuple(notes), verified)


def verify_live(config: Config, image: str, *, definition: str | None, docker: Docker, cache: Path,
                progress: Progress) -> LiveReport:
    """`vpatch verify IMAGE --live`: start `image` as its image definition's serve: section says, on a free
    port under a name of its own (production is not touched), run the live checks of the patches its labels
    name, then remove the container."""


    name = definition or docker.image(image).labels.get(f"{LABEL_PREFIX}.image")
    if not name:
        raise VpatchError(f"{image} names no image definition (label {LABEL_PREFIX}.image)",
                          hint="pass --definition NAME: the images/NAME.yaml whose serve: section starts it")
    found = ImageDefinition.load(config.root, name)
    if found.serve is None:
        raise VpatchError(f"images/{name}.yaml has no serve: section, so {image} cannot be started",
                          hint="add a serve: section (see docs) or pass --definition NAME")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    container = f"{found.serve.container.name}-verify-{uuid.uuid4().hex[:8]}"
    serve = replace(found.serve, port=port)
    live = plan_live(config, candidate=image, baseline=None, serve=serve, docker=docker, progress=progress, verify=False)
    if not live.checks:
        return LiveReport(live, ())
    command = render_command(serve, image, definition=name, name=container, restart="no")
    lint_command(docker, command, definition=name, cache=cache, progress=progress)
    progress(f"start: {image} as {container} on port {port} (removed afterwards)")
    cid = start(docker, command)
    try:
        took = wait_alive(docker, cid, health_url(port, serve.host), timeout=serve.health_timeout, progress=progress,
                          model=serve.model_name)
        progress(f"healthy after {took:.0f}s")
        server = Server(f"http://127.0.0.1:{port}", timeout=600)
        return LiveReport(live, tuple(run(live, server, progress, fail_fast=False)))
    finally:
        docker.remove_container(cid)


def run(plan: LivePlan, server: Server, progress: Progress, *, fail_fast: bool) -> list[PatchOutcome]:
    """Every planned check against `server`, in order; with `fail_fast`, stop after the first that fails."""
    out: list[PatchOutcome] = []
    for item in plan.checks:
        progress(f"live check: {item.patch} ({item.role.value}, {len(item.check.cases)} case(s))")
        cases = tuple(run_case(case, server) for case in item.check.cases)
        outcome = PatchOutcome(item, cases)
        for case in cases:
            progress(f"  {'pass' if case.ok else 'FAIL'}: {case.name}" + ("" if case.ok else f": {'; '.join(case.problems)}"))
        out.append(outcome)
        if fail_fast and not outcome.ok:
            break
    return out


def run_case(case: LiveCase, server: Server) -> CaseOutcome:
    """Send one case's request and judge the answer."""
    started = time.monotonic()
    request = case.request
    try:
        token_ids = _force_token_ids(request.force_tokens, server)
        body = request.body(server.model, token_ids)
        if request.stream:
            seen = observed_stream(request.api, server.post_stream(request.api.path, body))
        else:
            seen = observed_whole(request.api, server.post_json(request.api.path, body))
    except (ServerError, ValueError) as exc:
        message = exc.message if isinstance(exc, VpatchError) else f"unreadable answer: {exc}"
        return CaseOutcome(case.name, (message,), None, time.monotonic() - started)
    problems = forced_token_problems(request, token_ids, seen) + judge(case.expect, seen)
    return CaseOutcome(case.name, tuple(problems), seen, time.monotonic() - started)


def _force_token_ids(texts: Sequence[str], server: Server) -> dict[str, int]:
    """Each force_tokens text's one token id in the server's tokenizer; a text it has no single token for is
    refused (ValueError), since the case could not make the model spell it so."""
    out = {}
    for text in texts:
        ids = server.encode(text)
        if len(ids) != 1:
            raise ValueError(f"the server's tokenizer has no single token for {text!r} (it gives {ids}): "
                             "the case cannot force it; drop it from force_tokens")
        out[text] = ids[0]
    return out


def observed_stream(api: Api, lines: Sequence[str]) -> Observed:
    """A streamed answer as a client assembles it (content deltas and tool-call fragments by index), with the
    token ids of every chunk where the request asked for them."""
    events = list(sse_events(lines))
    choices = [choice for event in events for choice in _choices(event)]
    given = [choice["token_ids"] for choice in choices if isinstance(choice.get("token_ids"), list)]
    token_ids = tuple(int(i) for ids in given for i in ids) if given else None
    if api is Api.CHAT:
        chat = assemble_chat(events)
        return Observed(chat.text, tuple((c.name, c.arguments) for c in chat.tool_calls), chat.finish_reason,
                        token_ids)
    finish = next((c["finish_reason"] for c in reversed(choices) if c.get("finish_reason")), None)
    return Observed("".join(str(c.get("text") or "") for c in choices), (), finish, token_ids)


def observed_whole(api: Api, answer: Mapping[str, Any]) -> Observed:
    choices = answer.get("choices") or []
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError(f"no choices in the answer: {str(answer)[:200]}")
    choice = choices[0]
    given = choice.get("token_ids")
    token_ids = tuple(int(i) for i in given) if isinstance(given, list) else None
    if api is Api.COMPLETIONS:
        return Observed(str(choice.get("text") or ""), (), choice.get("finish_reason"), token_ids)
    message = choice.get("message") or {}
    calls = tuple((str((c.get("function") or {}).get("name") or ""), str((c.get("function") or {}).get("arguments") or ""))
                  for c in message.get("tool_calls") or ())
    return Observed(str(message.get("content") or ""), calls, choice.get("finish_reason"), token_ids)


def _choices(event: Mapping[str, object]) -> list[dict[str, Any]]:
    choices = event.get("choices")
    return [c for c in choices if isinstance(c, dict)] if isinstance(choices, list) else []


def alarms(outcomes: Sequence[PatchOutcome]) -> list[str]:
    """One sentence per false drop, for the report's end."""
    return [f"false-drop alarm: {o.planned.patch} was dropped as upstream ({o.planned.why}), but the candidate "
            f"fails its live check {o.planned.file}: upstream does not fix it on the path the server runs; "
            "bring the patch back (`git show` its last version from RETIRED.md)" for o in outcomes if o.false_drop]


def live_json(live: LiveReport | None) -> dict[str, Any] | None:
    """The live checks of a deploy (or a `verify --live`) as JSON: the plan's notes, then per patch per case."""
    if live is None:
        return None

    def side(outcomes: Sequence[PatchOutcome]) -> list[dict[str, Any]]:
        return [{"patch": o.planned.patch, "role": o.planned.role.value, "file": o.planned.file, "ok": o.ok,
                 "false_drop": o.false_drop, "why": o.planned.why,
                 "cases": [{"name": c.name, "ok": c.ok, "problems": list(c.problems), "seconds": round(c.seconds, 2),
                            "seen": None if c.seen is None else {
                                "content": c.seen.content, "finish_reason": c.seen.finish_reason,
                                "tool_calls": [{"name": n, "arguments": a} for n, a in c.seen.tool_calls]}}
                           for c in o.cases]} for o in outcomes]

    return {"verified": live.plan.verified, "notes": list(live.plan.notes),
            "planned": [{"patch": p.patch, "role": p.role.value, "file": p.file} for p in live.plan.checks],
            "candidate": side(live.candidate), "baseline": side(live.baseline)}


def _labelled(labels: Mapping[str, str]) -> tuple[str, ...] | None:
    """The patch names an image's labels list; None when it carries no vpatch labels at all."""
    if _PIN_LABEL not in labels:
        return None
    return tuple(n for n in labels.get(_PATCHES_LABEL, "").split(",") if n)


def _load(path: Path, root: Path) -> LiveCheck:
    try:
        source = str(path.relative_to(root))
    except ValueError:
        source = str(path)
    try:
        return LiveCheck.load(path, source=source)
    except LiveCheckError as exc:
        raise LiveCheckError(exc.message, hint=f"{exc.hint}; nothing was touched") from exc


def _verify(config: Config, image: str, docker: Docker, progress: Progress) -> str:

    progress(f"verify: {image} against its labels (the pin plus the series, file by file)")
    report = verify_image(config, image, docker=docker)
    failed = [c for c in report.checks if not c.ok]
    if failed:
        listed = "; ".join(f"{c.what}: {c.detail}" for c in failed[:5])
        raise VpatchError(f"candidate {image} does not match its labels ({len(failed)} check(s) failed: {listed}); "
                          "production was not touched",
                          hint=f"`vpatch verify {image}` lists every check; rebuild it with `vpatch build`")
    return f"{len(report.checks)} check(s) passed"
