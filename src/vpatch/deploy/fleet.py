"""`vpatch deploy` over the hosts of images/<name>.yaml, one step at a time: the standby first (its own checks,
sized to its serve section), then the lane is diverted to it (the before_switch hooks), only once it passed and
answered a real request, then production as a single-host deploy does it. A host whose deploy does not end
deployed was rolled back by that deploy; the fleet halts there, and no later host is touched."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from vpatch.base import Progress, VpatchError
from vpatch.config import Config, Hooks, HostRole, Suite
from vpatch.deploy.client import Server
from vpatch.deploy.live import LivePlan, plan_live
from vpatch.deploy.switch import BaselineMode, DeployDecision, Report, deploy, run_hooks
from vpatch.docker import Docker
from vpatch.serve import FleetHost
from vpatch.serve import base_url as alive_url

# The standby's answer before the lane is diverted to it: a short real completion.
ANSWER_PROMPT = "The standby answers before the lane is diverted to it:"
ANSWER_TOKENS = 8


@dataclass(frozen=True)
class Answer:
    """The real request the standby answered before the lane went to it."""

    url: str
    tokens: int  # completion tokens it sent
    seconds: float


@dataclass(frozen=True)
class HostDeploy:
    """One host's step of the fleet deploy."""

    host: str
    role: HostRole
    report: Report | None  # None: its deploy raised (rolled back), see `error`
    error: str | None = None  # the deploy's error (after its rollback)
    plan: LivePlan | None = None

    @property
    def deployed(self) -> bool:
        return self.report is not None and self.report.decision is DeployDecision.DEPLOYED


@dataclass(frozen=True)
class FleetReport:
    definition: str
    image: str
    steps: tuple[HostDeploy, ...]  # in the order run; a halted fleet has no step for the hosts after the halt
    answer: Answer | None  # the standby's real request (None: no standby, or it never got that far)
    diverted: bool  # the before_switch hooks ran: the lane went to the standby
    halted_at: str | None  # the host whose deploy did not end deployed

    @property
    def deployed(self) -> bool:
        return self.halted_at is None


def deploy_fleet(config: Config, *, connected: list[tuple[FleetHost, Docker]], image: str, cache: Path,
                 progress: Progress, baseline: BaselineMode) -> FleetReport:
    """Deploy `image` to each host of `connected` in order (the standby first); halt at the first that is not
    deployed. The lane's hooks: before_switch once the standby passed and answered, after_switch with
    production's decision; a standby deployed alone (`--host`) runs no hook (the lane is not on it)."""
    definition = connected[0][0].definition.name
    roles = {place.role for place, _ in connected}
    steps: list[HostDeploy] = []
    answer: Answer | None = None
    diverted = False
    for place, docker in connected:
        serve = place.definition.serve
        if serve is None:
            raise VpatchError(f"host {place.name}: images/{definition}.yaml gives it no serve: section",
                              hint="deploy starts the candidate from serve:")
        suite = _lane_hooks(place.definition.deploy, place.role, roles, diverted)
        progress(f"host {place.name} ({place.role.value}): deploying {image}")
        with place.state():
            production = docker.container(serve.container.name)
            plan = plan_live(config, candidate=image, docker=docker, serve=serve, progress=progress,
                             baseline=production.image_id if production is not None and production.status == "running"
                             else None)
            try:
                report = deploy(definition=definition, serve=serve, suite=suite, image=image, docker=docker,
                                cache=cache, progress=progress, live=plan, baseline=baseline,
                                reach=place.server_host, daemon=place.daemon)
            except VpatchError as exc:
                if diverted:
                    # Its deploy ended in an error after its rollback, before its own after_switch: the lane comes
                    # back to the production it restored all the same.
                    run_hooks(place.definition.deploy.hooks.after_switch, "after_switch", progress, strict=False)
                steps.append(HostDeploy(place.name, place.role, None, exc.message, plan))
                return FleetReport(definition, image, tuple(steps), answer, diverted, place.name)
        step = HostDeploy(place.name, place.role, report, None, plan)
        steps.append(step)
        if not step.deployed:
            return FleetReport(definition, image, tuple(steps), answer, diverted, place.name)
        if place.role is HostRole.STANDBY and HostRole.PRODUCTION in roles:
            # The lane goes to the standby only once it answers a real request, not only its checks' own.
            answer = _answer(alive_url(serve.port, place.server_host), suite.request_timeout_s, place.name)
            progress(f"host {place.name} answered {answer.tokens} tokens in {answer.seconds:.1f}s: diverting the lane")
            run_hooks(place.definition.deploy.hooks.before_switch, "before_switch", progress, strict=True)
            diverted = True
    return FleetReport(definition, image, tuple(steps), answer, diverted, None)


def _lane_hooks(suite: Suite, role: HostRole, roles: set[HostRole], diverted: bool) -> Suite:
    """The hooks a host's own deploy runs: none on the standby (the lane is not on it while it switches); on
    production after_switch only once the fleet diverted the lane (its before_switch already ran)."""
    if role is HostRole.STANDBY:
        return replace(suite, hooks=Hooks())
    if HostRole.STANDBY in roles:
        return replace(suite, hooks=Hooks(after_switch=suite.hooks.after_switch) if diverted else Hooks())
    return suite


def _answer(url: str, timeout: float, host: str) -> Answer:
    server = Server(url, timeout=timeout)
    try:
        timing = server.complete(ANSWER_PROMPT, max_tokens=ANSWER_TOKENS)
    except (VpatchError, OSError) as exc:
        raise VpatchError(f"host {host} passed its checks but did not answer a request at {url}: {exc}",
                          hint="the lane stays where it is; production is untouched") from exc
    if timing.completion_tokens < 1:
        raise VpatchError(f"host {host} passed its checks but its answer at {url} held no token",
                          hint="the lane stays where it is; production is untouched")
    return Answer(url, timing.completion_tokens, timing.seconds)
