"""vpatch: a pinned upstream vLLM commit plus a numbered series of local diffs."""

__version__ = "0.1.0"
