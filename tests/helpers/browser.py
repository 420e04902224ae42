"""A page as a real browser sees it: Debian's headless `chromium` loads it, gives the DOM it built and the
console lines it logged (errors, uncaught exceptions, console.* calls)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import pytest


def chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        why = "no chromium on PATH: the report's browser test needs Debian's `apt-get install chromium`"
        if os.environ.get("CI"):  # .ci/run installs it: in CI a missing browser is a failure, never a skip
            pytest.fail(why)
        pytest.skip(why)
    return found


@dataclass(frozen=True)
class Loaded:
    dom: str  # the document as the browser serialises it after loading
    console: tuple[str, ...]  # every console line chromium logged


def load(page: Path) -> Loaded:
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                               "--v=0", f"--user-data-dir={profile}", "--dump-dom", page.resolve().as_uri()],
                              capture_output=True, text=True, timeout=120, check=True)
    return Loaded(done.stdout, tuple(line for line in done.stderr.splitlines() if ":CONSOLE" in line))


@dataclass
class Plot:
    samples: int  # what the page says it plotted (data-samples)
    markers: int  # <use> elements (one marker per point) in the SVG groups whose id starts with data-counted
    has_svg: bool = False
    has_table: bool = False


class _Plots(HTMLParser):
    """Each <figure data-plot=...>: its declared samples and the markers in the browser's DOM."""

    def __init__(self) -> None:
        super().__init__()
        self.plots: dict[str, Plot] = {}
        self.decision = ""
        self._stack: list[tuple[str, str | None]] = []  # (tag, counted group id) of each open element
        self._figure: tuple[str, str] | None = None  # (plot id, counted prefix)
        self._figure_depth = 0
        self._in_decision = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "figure" and a.get("data-plot"):
            self._figure = (str(a["data-plot"]), str(a.get("data-counted") or a["data-plot"]))
            self._figure_depth = len(self._stack)
            self.plots[self._figure[0]] = Plot(int(a.get("data-samples") or 0), 0)
        counted = None
        if self._figure is not None:
            plot = self.plots[self._figure[0]]
            plot.has_svg |= tag == "svg"
            plot.has_table |= tag == "table"
            group = a.get("id") or ""
            if tag == "g" and group.startswith(self._figure[1]):
                counted = group
            if tag == "use" and any(c for _, c in self._stack):
                plot.markers += 1
        self._in_decision |= a.get("id") == "decision"
        if tag not in ("meta", "br", "img", "input", "link", "hr"):  # HTML's void elements are never closed
            self._stack.append((tag, counted))

    def handle_endtag(self, tag: str) -> None:
        if all(open_tag != tag for open_tag, _ in self._stack):
            return
        while self._stack:
            open_tag, _ = self._stack.pop()
            if open_tag == tag:
                break
        if tag == "figure" and self._figure is not None and len(self._stack) <= self._figure_depth:
            self._figure = None
        if tag == "p":
            self._in_decision = False

    def handle_data(self, data: str) -> None:
        if self._in_decision:
            self.decision += data


def plots(dom: str) -> tuple[str, dict[str, Plot]]:
    """(the decision line, each plot) of a report page's DOM."""
    parser = _Plots()
    parser.feed(dom)
    return parser.decision.strip(), parser.plots
