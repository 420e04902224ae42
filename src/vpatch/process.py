"""What a finished process or container command left behind: exit code and both output streams."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Output:
    returncode: int
    stdout: bytes
    stderr: bytes

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def err(self) -> str:
        return self.stderr.decode("utf-8", "replace")
