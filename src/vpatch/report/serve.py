"""How `vpatch serve` shows its results: the started server, `--check`'s verdict, and `--diff`'s drift (lines
for people, JSON for CI)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vpatch.serve import ContainerCheck, DriftReport, HostDrift, Served


def served_lines(served: Served, url: str) -> list[str]:
    """A started server: its container, how long it took to be healthy and where, and what the lint knew."""
    return [f"{served.command.name} ({served.container_id[:12]}) is healthy after {served.seconds_to_healthy:.0f}s: "
            f"{url}",
            f"lint: entrypoint `{' '.join(served.lint.entrypoint)}`, {len(served.lint.flags)} flag(s) known to "
            f"vLLM {served.lint.vllm_version}"]


def container_check_line(checked: ContainerCheck) -> str:
    """`--check`: the container, its state and docker's health, and the liveness verdict."""
    health = f", docker health {checked.docker_health}" if checked.docker_health else ", no docker health check"
    return f"{checked.container} ({checked.status}{health}): {checked.verdict.line()}"


def drift_json(result: DriftReport) -> dict[str, Any]:
    return {"container": result.container.name, "image": result.image, "running_image": result.running_image,
            "drifts": [vars(d) for d in result.drifts]}


def drift_lines(result: DriftReport, name: str) -> list[str]:
    """Each drift as its yaml and running values, or the one line saying the container runs what the yaml says."""
    if not result.drifts:
        return [f"{result.container.name} runs exactly what images/{name}.yaml says: {result.running_image}"]
    lines = [f"{result.container.name} differs from images/{name}.yaml:"]
    width = max(len(d.what) for d in result.drifts)
    for d in result.drifts:
        lines.append(f"  {d.what:<{width}}  yaml: {d.yaml}")
        lines.append(f"  {'':<{width}}  running: {d.running}")
    return lines


def _flags(result: DriftReport) -> str:
    """The container's vLLM words after the model, as it runs them."""
    return " ".join(result.container.args) or "(none)"


def fleet_drift_json(found: list[HostDrift]) -> list[dict[str, Any]]:
    """`serve --diff --json` over hosts: one object per host; `clean` is true when it runs exactly what the
    definition says for it."""
    out = []
    for d in found:
        item: dict[str, Any] = {"host": d.place.name, "role": d.place.role.value,
                                "docker": d.place.host.endpoint.text if d.place.host else None,
                                "clean": d.clean, "container": d.container}
        if d.report is None:
            item.update(state="absent", image=None, running_image=None, args=None, drifts=[])
        else:
            item.update(image=d.report.image, running_image=d.report.running_image, args=list(d.report.container.args),
                        drifts=[vars(x) for x in d.report.drifts])
        out.append(item)
    return out


def fleet_drift_lines(found: list[HostDrift], name: str) -> list[str]:
    """One table of which host runs which image with which flags, then each drifting host's drift."""
    rows = [("host", "role", "container", "runs", "drift")]
    for d in found:
        if d.report is None:
            rows.append((d.place.name, d.place.role.value, d.container, "(no such container)", "absent"))
        else:
            count = len(d.report.drifts)
            rows.append((d.place.name, d.place.role.value, d.container, d.report.running_image,
                         "clean" if not count else f"{count} drift{'s' if count > 1 else ''}"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(f"{cell:<{w}}" for cell, w in zip(r[:4], widths, strict=True)) + "  " + r[4] for r in rows]
    for d in found:
        if d.report is not None:
            lines.append(f"{d.place.name} flags: {_flags(d.report)}")
    for d in found:
        if d.report is None:
            lines.append(f"{d.place.name}: no container {d.container}: `vpatch serve {name} --host {d.place.name}` "
                         "starts it")
        elif d.report.drifts:
            lines += [f"{d.place.name}: " + line for line in drift_lines(d.report, name)]
    return lines
