"""How `vpatch serve --diff` shows a running container against its yaml: lines for people, JSON for CI."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vpatch.serve.drift import DriftReport


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
