"""The server's configuration (`serve:` in images/<name>.yaml): render, lint against the image, start, drift.

- render.py  the exact `docker run` argv for a ServeConfig and an image (what --print shows and what runs)
- lint.py    the argv against the image's entrypoint and the vLLM inside it, before anything is touched
- run.py     start the container and wait until /health answers
- drift.py   a running container (docker inspect) against the yaml and the image's labels
- fleet.py   the hosts of `hosts:`: each one's definition, daemon and drift

Other rooms import these names from here; modules inside the room import each other directly."""

from vpatch.serve.alive import HttpError, Unreachable, base_url, open_url
from vpatch.serve.alive import samples as metric_samples
from vpatch.serve.drift import DriftReport
from vpatch.serve.drift import diff as container_drift
from vpatch.serve.fleet import FleetHost, HostDrift, connect_all, fleet_drift, places
from vpatch.serve.health import NotAlive, refuse_taken_port, wait_alive
from vpatch.serve.health import down as why_down
from vpatch.serve.lint import check as lint_command
from vpatch.serve.render import LABEL_DEFINITION, LABEL_DEPLOY, RunCommand
from vpatch.serve.render import for_serve as serve_command
from vpatch.serve.render import render as render_command
from vpatch.serve.run import ContainerCheck, Served, health_url, start
from vpatch.serve.run import check as check_container
from vpatch.serve.run import serve as serve_definition

__all__ = [
    "LABEL_DEFINITION",
    "LABEL_DEPLOY",
    "ContainerCheck",
    "DriftReport",
    "FleetHost",
    "HostDrift",
    "HttpError",
    "NotAlive",
    "RunCommand",
    "Served",
    "Unreachable",
    "base_url",
    "check_container",
    "connect_all",
    "container_drift",
    "fleet_drift",
    "health_url",
    "lint_command",
    "metric_samples",
    "open_url",
    "places",
    "refuse_taken_port",
    "render_command",
    "serve_command",
    "serve_definition",
    "start",
    "wait_alive",
    "why_down",
]
