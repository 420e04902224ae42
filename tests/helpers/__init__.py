"""Helpers shared by several test modules (test modules import from here, never from each other)."""
