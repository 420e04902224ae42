"""A real package index on this machine for tests: PEP 503 pages under a folder (file://) or
PEP 691 JSON / HTML served by http.server on 127.0.0.1, and pip pointed at it through its own settings."""

from __future__ import annotations

import hashlib
import html
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest


@dataclass
class SimpleIndex:
    """Files of one project: <root>/files/<name>, pages at <root>/simple/<project>/index.html."""

    root: Path
    project: str = "vllm"
    entries: list[dict[str, Any]] = field(default_factory=list)

    def add(self, filename: str, data: bytes, *, claimed_sha256: str | None = None, yanked: bool = False) -> None:
        """Offer a file; `claimed_sha256` makes the index lie about its hash."""
        (self.root / "files").mkdir(parents=True, exist_ok=True)
        (self.root / "files" / filename).write_bytes(data)
        self.entries.append({"filename": filename, "sha256": claimed_sha256 or hashlib.sha256(data).hexdigest(),
                             "yanked": yanked, "size": len(data)})
        self._write()

    def _write(self) -> None:
        page = self.root / "simple" / self.project
        page.mkdir(parents=True, exist_ok=True)
        links = "".join(
            f'<a href="../../files/{html.escape(e["filename"])}#sha256={e["sha256"]}"'
            + (' data-yanked=""' if e["yanked"] else "") + f'>{html.escape(e["filename"])}</a><br>\n'
            for e in self.entries
        )
        (page / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
        files = [{"filename": e["filename"], "url": f"../../files/{e['filename']}", "hashes": {"sha256": e["sha256"]},
                  "size": e["size"], "yanked": e["yanked"]} for e in self.entries]
        (page / "index.json").write_text(json.dumps({"meta": {"api-version": "1.1"}, "name": self.project,
                                                     "files": files}))

    @property
    def file_url(self) -> str:
        return (self.root / "simple").as_uri()

    @contextmanager
    def served(self) -> Iterator[str]:
        """Serve the index over HTTP on a free port of 127.0.0.1; yields the simple API's URL."""
        root = self.root

        class Handler(SimpleHTTPRequestHandler):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, directory=str(root), **kwargs)

            def do_GET(self) -> None:
                if self.path.startswith("/simple/") and "json" in self.headers.get("Accept", ""):
                    body = (root / self.path.lstrip("/") / "index.json").read_bytes()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                super().do_GET()

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/simple"
        finally:
            server.shutdown()
            server.server_close()


def point_pip_at(monkeypatch: pytest.MonkeyPatch, url: str, *, config: Path | None = None) -> None:
    """pip's own settings name only `url` (through PIP_INDEX_URL unless a config file is given)."""
    for var in list(os.environ):
        if var.startswith("PIP_"):
            monkeypatch.delenv(var)
    if config is None:
        monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # pip reads no config file at all
        monkeypatch.setenv("PIP_INDEX_URL", url)
    else:
        monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
