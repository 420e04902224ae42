"""How `vpatch serve` shows its results: the started server, `--check`'s verdict, and `--diff`'s drift (lines
for people, JSON for CI)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vpatch.serve import ContainerCheck, DriftReport, Served


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
