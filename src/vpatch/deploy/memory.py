"""Memory headroom while the checks run: each GPU (nvidia-smi), or the container against its limit (docker stats).

The two-builds write-up: the nightly got down to ~200 MB free per card under four long parallel requests,
and the same "memory allocation failed" warning preceded a crash. The log scan sees the warning after the
fact; the floor here fails the check that crosses it while it runs (the watchdog polls `breach`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from vpatch.base import ProcessError, VpatchError, run_process
from vpatch.deploy.series import MemoryPoint, Recorder
from vpatch.docker import Docker

MIB = 1024 * 1024
SAMPLE_EVERY_S = 0.5


@dataclass(frozen=True)
class DeviceMemory:
    device: str  # "gpu0" ... or "container"
    used_mib: float
    total_mib: float
    resident_mib: float | None = None  # a container's own (anonymous) memory; None for a GPU


Source = Callable[[], list[DeviceMemory]]


def container_source(docker: Docker, container: str) -> Source:
    """The container's memory against its limit, as docker's stats report them (the CPU server's case)."""
    def read() -> list[DeviceMemory]:
        found = docker.container_memory(container)
        if found is None:
            return []
        resident = None if found.resident is None else found.resident / MIB
        return [DeviceMemory("container", found.used / MIB, found.limit / MIB, resident)]
    return read


def parse_nvidia_smi(text: str) -> list[DeviceMemory]:
    """`nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader,nounits` (MiB)."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3:
            continue
        try:
            out.append(DeviceMemory(f"gpu{int(parts[0])}", float(parts[1]), float(parts[2])))
        except ValueError:
            continue  # "[N/A]" on a card that does not report memory
    return out


def gpu_source() -> Source:
    """Every card of the host, per card, through nvidia-smi (what the GPU host has, with no Python binding
    to install). Untestable here: the test machines have no GPU; parse_nvidia_smi is tested on its output."""
    def read() -> list[DeviceMemory]:
        try:
            done = run_process(["nvidia-smi", "--query-gpu=index,memory.used,memory.total",
                                "--format=csv,noheader,nounits"], timeout=10)
        except ProcessError:
            return []
        return parse_nvidia_smi(done.out)
    return read


class MemoryWatch:
    """Samples `source` on a thread from start() to stop() into the recorder; the first reading of a device
    below `floor_mib` free is kept as `breach` (why, in words), which the checks turn into a failure."""

    def __init__(self, source: Source, recorder: Recorder, floor_mib: float | None, *,
                 every: float = SAMPLE_EVERY_S) -> None:
        self.source = source
        self.recorder = recorder
        self.floor_mib = floor_mib
        self.every = every
        self.breach: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, daemon=True, name="vpatch-memory")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.every)

    def sample(self) -> list[MemoryPoint]:
        # The check running when the reading began: a reading takes a while (docker's stats), a short check
        # may be over by the time it returns.
        check = self.recorder.check
        try:
            found = self.source()
        except VpatchError:
            return []  # the daemon away for a moment: the next reading may see it again
        now = self.recorder.at(time.monotonic())
        points = [MemoryPoint(now, d.device, d.used_mib, d.total_mib, check, d.resident_mib) for d in found]
        self.recorder.add("memory", points)
        if self.floor_mib is not None and self.breach is None:
            low = [p for p in points if p.free_mib < self.floor_mib]
            if low:
                p = low[0]
                self.breach = (f"{p.device} down to {p.free_mib:,.0f} MiB free of {p.total_mib:,.0f} MiB "
                               f"(floor {self.floor_mib:,.0f} MiB) at {p.t:.1f}s, during {p.check or 'the checks'}")
        return points
