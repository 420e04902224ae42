"""What `vpatch probe new` writes: each template a file of its own, linted and type-checked as the code is, its
placeholder (`NAME`) replaced by the patch's name."""

from pathlib import Path

COMMAND_PROBE = Path(__file__).with_name("command_probe.py")
NAME = "NNNN-slug"

__all__ = ["COMMAND_PROBE", "NAME"]
