"""Builds the image for the pin plus the series (the strategy and why, the base, the labels) and verifies one
against its labels.

Other rooms import these names from here; modules inside the room import each other directly."""

from vpatch.image.build import BuildResult, build_image, plan_build, plan_command
from vpatch.image.plan import LABEL_PREFIX, describe
from vpatch.image.verify import CheckKind, VerifyReport, verify_image

__all__ = [
    "LABEL_PREFIX",
    "BuildResult",
    "CheckKind",
    "VerifyReport",
    "build_image",
    "describe",
    "plan_build",
    "plan_command",
    "verify_image",
]
