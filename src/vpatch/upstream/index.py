"""The package index pip is configured with, read directly: its simple API (PEP 691 JSON or PEP 503 HTML).

Reading an sdist's URL and hash from the index and downloading it with urllib skips what makes
`pip download` slow for vLLM: a build environment with torch in it, just to read metadata.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import http.client
import json
import os
import ssl
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import BinaryIO

from packaging.utils import (
    InvalidSdistFilename,
    canonicalize_name,
    parse_sdist_filename,
)
from packaging.version import Version

from vpatch.base import UpstreamError, run_process

PYPI = "https://pypi.org/simple"
# PEP 691: ask for JSON, accept HTML (PEP 503) from indexes that only have that.
_ACCEPT = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01"
_JSON_TYPE = "application/vnd.pypi.simple.v1+json"
# The hashes pip accepts in an index link; the strongest one the index gives is checked.
_HASHES = ("sha512", "sha384", "sha256", "sha224")
_CHUNK = 1 << 20
_ATTEMPTS = 3
# Failures worth another attempt: the network, not the request (an HTTP 4xx is not retried).
_TRANSIENT = (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException)

BytesFn = Callable[[int, int | None], None]  # (bytes so far, total or None)


def _truthy(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class IndexSettings:
    """What `pip download` (or `pip install`) would use to find a file: its indexes, certificates and trusted hosts."""

    index_urls: tuple[str, ...] = (PYPI,)  # index-url first, then each extra-index-url
    find_links: tuple[str, ...] = ()  # folders or pages of files pip reads beside the indexes (pip's `find-links`)
    constraints: tuple[str, ...] = ()  # constraint files pip applies to every install (pip's `constraint`)
    cert: str | None = None  # CA bundle (pip's `cert`)
    client_cert: str | None = None  # PEM with key and certificate (pip's `client-cert`)
    trusted_hosts: tuple[str, ...] = ()  # hosts whose certificate is not checked (pip's `trusted-host`)
    timeout: float = 15.0

    @classmethod
    def parse(cls, items: Mapping[str, str], command: str = "download") -> IndexSettings:
        """From `pip config list` items ("global.index-url" -> value); later sections win, as in pip."""
        merged: dict[str, str] = {}
        # pip reads [global], then the command's own section, then PIP_* variables (":env:").
        for section in ("global", command, ":env:"):
            for key, value in items.items():
                where, _, name = key.rpartition(".")
                if where == section:
                    merged[name.replace("_", "-")] = value
        if _truthy(merged.get("no-index", "")):
            urls: tuple[str, ...] = ()
        else:
            urls = (merged.get("index-url") or PYPI, *merged.get("extra-index-url", "").split())
        timeout = merged.get("timeout") or merged.get("default-timeout")
        return cls(
            index_urls=tuple(u.rstrip("/") for u in urls),
            cert=merged.get("cert") or os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE"),
            client_cert=merged.get("client-cert"),
            trusted_hosts=tuple(merged.get("trusted-host", "").split()),
            find_links=tuple(merged.get("find-links", "").split()),
            constraints=tuple(merged.get("constraint", "").split()),
            timeout=float(timeout) if timeout else cls.timeout,
        )

    @classmethod
    def from_pip(cls, python: str = sys.executable, command: str = "download") -> IndexSettings:
        """pip's own view of its configuration (files, PIP_* variables) for `command`, as `pip config list` shows it."""

        result = run_process([python, "-m", "pip", "config", "list"], check=False)
        if result.returncode != 0 and "No module named pip" in result.err:
            # An interpreter without pip (a pipx or --without-pip venv): its PIP_* variables still count.
            return cls.parse({f":env:.{k[4:].lower().replace('_', '-')}": v
                              for k, v in os.environ.items() if k.startswith("PIP_")}, command)
        if result.returncode != 0:
            raise UpstreamError(f"cannot read pip's configuration: pip config list exited with {result.returncode}\n"
                                + result.err.strip()[-2000:],
                                hint="vpatch reads the package index from pip's configuration; check `pip config list`")
        items: dict[str, str] = {}
        for line in result.out.splitlines():
            key, sep, value = line.partition("=")
            if not sep:
                continue
            try:
                parsed = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                parsed = value
            items[key.strip()] = str(parsed)
        return cls.parse(items, command)


@dataclass(frozen=True)
class Distribution:
    """One file an index offers."""

    filename: str
    url: str
    hash_name: str | None  # the strongest hash the index gives for it, e.g. "sha256"
    hash_value: str | None
    size: int | None = None
    yanked: bool = False

    @property
    def sdist_version(self) -> Version | None:
        if not self.filename.endswith(".tar.gz"):
            return None
        try:
            return parse_sdist_filename(self.filename)[1]
        except InvalidSdistFilename:
            return None


class _Links(HTMLParser):
    """The anchors of a PEP 503 page: href plus the data-* attributes that matter."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.links.append(dict(attrs))


def _pick_hash(hashes: Mapping[str, str]) -> tuple[str | None, str | None]:
    for name in _HASHES:
        if hashes.get(name):
            return name, hashes[name].lower()
    return None, None


def parse_page(body: bytes, content_type: str, page_url: str) -> list[Distribution]:
    """The files of one project page, JSON (PEP 691) or HTML (PEP 503); URLs made absolute."""
    if content_type.split(";")[0].strip() == _JSON_TYPE:
        try:
            files = json.loads(body)["files"]
        except (ValueError, KeyError, TypeError) as exc:
            raise UpstreamError(f"{page_url}: not a PEP 691 project page: {exc}") from exc
        out = []
        for item in files:
            name, value = _pick_hash(item.get("hashes") or {})
            yanked = item.get("yanked", False)
            out.append(Distribution(item["filename"], urllib.parse.urljoin(page_url, item["url"]), name, value,
                                    item.get("size"), yanked is not False))
        return out
    parser = _Links()
    parser.feed(body.decode("utf-8", "replace"))
    out = []
    for attrs in parser.links:
        href = attrs.get("href")
        if not href:
            continue
        url, _, fragment = urllib.parse.urljoin(page_url, href).partition("#")
        hashes = dict([fragment.split("=", 1)]) if "=" in fragment else {}
        name, value = _pick_hash(hashes)
        filename = urllib.parse.unquote(url.rsplit("/", 1)[-1])
        out.append(Distribution(filename, url, name, value, None, "data-yanked" in attrs))
    return out


@dataclass
class Index:
    """A client for the configured indexes; project pages are read once per instance."""

    given: IndexSettings | None = None  # None: pip's own configuration, read on first use
    _settings: IndexSettings | None = field(default=None, repr=False)
    _pages: dict[str, list[Distribution]] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def settings(self) -> IndexSettings:
        if self._settings is None:
            self._settings = self.given or IndexSettings.from_pip()
        return self._settings

    def files(self, project: str) -> list[Distribution]:
        """Every file of `project` on every configured index (pip merges them the same way)."""
        key = canonicalize_name(project)
        with self._lock:
            if key not in self._pages:
                self._pages[key] = self._read_project(key)
            return self._pages[key]

    def sdists(self, project: str) -> dict[Version, Distribution]:
        """The .tar.gz sdist of each version; the first index that has one wins, as pip's order goes."""
        found: dict[Version, Distribution] = {}
        for dist in self.files(project):
            version = dist.sdist_version
            if version is not None and version not in found:
                found[version] = dist
        return found

    def sdist(self, project: str, version: str) -> Distribution:
        wanted = Version(version)
        dist = self.sdists(project).get(wanted)
        if dist is None:
            raise UpstreamError(
                f"no sdist of {project} {version} on the configured index ({', '.join(self.settings.index_urls)})",
                hint="check the version (`vpatch releases --list`, or the index's page) and pip's index-url",
            )
        return dist

    def _read_project(self, project: str) -> list[Distribution]:
        if not self.settings.index_urls:
            raise UpstreamError("pip is configured with no-index: there is no package index to read",
                                hint="unset no-index (PIP_NO_INDEX) or name an index with PIP_INDEX_URL")
        files: list[Distribution] = []
        problems: list[str] = []
        for base in self.settings.index_urls:
            page = f"{base}/{project}/"
            try:
                body, content_type, final = self._get_page(page)
            except FileNotFoundError:
                continue  # pip, too, passes over an index that does not have the project
            except (OSError, urllib.error.URLError) as exc:
                problems.append(f"{_redact(page)}: {_reason(exc)}")
                continue
            files += parse_page(body, content_type, final)
        if not files and problems:
            raise UpstreamError(f"cannot read the package index for {project}:\n" + "\n".join(problems),
                                hint="check the network and pip's index settings (`pip config list`)")
        return files

    def _get_page(self, url: str) -> tuple[bytes, str, str]:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme == "file":
            # pip reads a local index folder's index.html; a missing folder is not an error.
            path = Path(urllib.request.url2pathname(parsed.path))
            if path.is_dir():
                path = path / "index.html"
            return path.read_bytes(), "text/html", path.as_uri()
        with self._open(url, accept=_ACCEPT) as response:
            return response.read(), response.headers.get("Content-Type", "text/html"), response.geturl()

    def _open(self, url: str, *, accept: str | None = None) -> http.client.HTTPResponse:
        parsed = urllib.parse.urlsplit(url)
        headers = {"User-Agent": "vpatch (urllib)"}
        if accept:
            headers["Accept"] = accept
        if parsed.username is not None:
            # Credentials in the index URL, as pip allows: sent as basic auth, kept out of the URL.
            token = f"{urllib.parse.unquote(parsed.username)}:{urllib.parse.unquote(parsed.password or '')}"
            headers["Authorization"] = "Basic " + base64.b64encode(token.encode()).decode()
            host = (parsed.hostname or "") + (f":{parsed.port}" if parsed.port else "")
            url = urllib.parse.urlunsplit(parsed._replace(netloc=host))
        context = self._context(parsed.hostname or "", parsed.port)
        try:
            response: http.client.HTTPResponse = urllib.request.urlopen(
                urllib.request.Request(url, headers=headers), timeout=self.settings.timeout, context=context)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                raise FileNotFoundError(url) from exc
            raise
        return response

    def _context(self, host: str, port: int | None) -> ssl.SSLContext:
        trusted = host in self.settings.trusted_hosts or f"{host}:{port}" in self.settings.trusted_hosts
        if trusted:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        else:
            context = ssl.create_default_context(cafile=self.settings.cert)
        if self.settings.client_cert:
            context.load_cert_chain(self.settings.client_cert)
        return context

    def download(self, dist: Distribution, out: BinaryIO, progress: BytesFn | None = None) -> None:
        """Write `dist` to `out`, checking the index's hash; UpstreamError on a mismatch.

        A dropped connection is tried again (from the start, `out` rewound) up to _ATTEMPTS times, as pip does."""
        if dist.hash_name is None or dist.hash_value is None:
            raise UpstreamError(f"the index gives no hash for {dist.filename}, so its download cannot be checked",
                                hint="use an index that publishes sha256 hashes (PyPI does)")
        for attempt in range(1, _ATTEMPTS + 1):
            out.seek(0)
            out.truncate()
            try:
                got = self._transfer(dist, out, progress)
                break
            except _TRANSIENT as exc:
                if attempt == _ATTEMPTS or (isinstance(exc, urllib.error.HTTPError) and exc.code < 500):
                    raise UpstreamError(f"cannot download {dist.filename} from {_redact(dist.url)}: {_reason(exc)}",
                                        hint="check the network and pip's index settings, then run the command again"
                                        ) from exc
                time.sleep(attempt)
            except OSError as exc:  # a missing file, an HTTP 404, a full disk: trying again changes nothing
                raise UpstreamError(f"cannot download {dist.filename} from {_redact(dist.url)}: {_reason(exc)}",
                                    hint="check pip's index settings and the disk, then run the command again") from exc
        if got != dist.hash_value:
            raise UpstreamError(
                f"{dist.filename}: {dist.hash_name} mismatch: the index says {dist.hash_value}, the download has {got}",
                hint="the file changed on the way or on the index; nothing was kept. Try again, or check the index",
            )

    def _transfer(self, dist: Distribution, out: BinaryIO, progress: BytesFn | None) -> str:
        """One attempt: copy the file to `out`; returns the hex digest of what arrived."""
        assert dist.hash_name is not None
        digest = hashlib.new(dist.hash_name)
        done = 0
        if dist.url.startswith("file:"):
            local = Path(urllib.request.url2pathname(urllib.parse.urlsplit(dist.url).path))
            source: BinaryIO = local.open("rb")  # closed by the `with source` below
            total = dist.size
        else:
            response = self._open(dist.url)
            source = response
            length = response.headers.get("Content-Length")
            total = int(length) if length else dist.size
        with source:
            for chunk in iter(lambda: source.read(_CHUNK), b""):
                digest.update(chunk)
                out.write(chunk)
                done += len(chunk)
                if progress:
                    progress(done, total)
        return digest.hexdigest()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    return str(exc)


def _redact(url: str) -> str:
    """A URL fit for a message: no password."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.password is None:
        return url
    return urllib.parse.urlunsplit(parsed._replace(netloc=parsed.netloc.replace(f":{parsed.password}@", ":***@")))
