"""Builds the image for the pin plus the series (the strategy and why, the base, the labels) and verifies one
against its labels.

Other rooms import these names from here; modules inside the room import each other directly."""

from vpatch.image.plan import LABEL_PREFIX, describe
from vpatch.image.verify import verify_image

__all__ = [
    "LABEL_PREFIX",
    "describe",
    "verify_image",
]
