"""The server's configuration (`serve:` in images/<name>.yaml): render, lint against the image, start, drift.

- config.py  ServeConfig / ContainerOptions: parse and validate the `serve:` section
- render.py  the exact `docker run` argv for a ServeConfig and an image (what --print shows and what runs)
- lint.py    the argv against the image's entrypoint and the vLLM inside it, before anything is touched
- run.py     start the container and wait until /health answers
- drift.py   a running container (docker inspect) against the yaml and the image's labels
"""
