"""The server's configuration (`serve:` in images/<name>.yaml): render, lint against the image, start, drift.

- render.py  the exact `docker run` argv for a ServeConfig and an image (what --print shows and what runs)
- lint.py    the argv against the image's entrypoint and the vLLM inside it, before anything is touched
- run.py     start the container and wait until /health answers
- drift.py   a running container (docker inspect) against the yaml and the image's labels

Other rooms import these names from here; modules inside the room import each other directly."""

from vpatch.serve.alive import base_url
from vpatch.serve.drift import DriftReport
from vpatch.serve.health import refuse_taken_port, wait_alive
from vpatch.serve.render import LABEL_DEFINITION, LABEL_DEPLOY
from vpatch.serve.run import ContainerCheck, Served, health_url, start

__all__ = [
    "LABEL_DEFINITION",
    "LABEL_DEPLOY",
    "ContainerCheck",
    "DriftReport",
    "Served",
    "base_url",
    "health_url",
    "refuse_taken_port",
    "start",
    "wait_alive",
]
