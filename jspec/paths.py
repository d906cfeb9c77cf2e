"""Where jspec finds what it ships and keeps what it caches (no jax import: the CLI's --help reads it)."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
CHECKPOINTS = PACKAGE.parent / "checkpoints"  # the shipped model pair
# XLA's autotuning results (compile_cache.seed_autotune) and lookahead's costs (lookahead.SHIPPED) for the shipped
# pair and the 8B-shaped benchmark program on an H200.
AUTOTUNE_DIR = PACKAGE / "autotune"


def cache_root() -> Path:
    """$JSPEC_CACHE_DIR, else $XDG_CACHE_HOME/jspec, else ~/.cache/jspec."""
    if os.environ.get("JSPEC_CACHE_DIR"):
        return Path(os.environ["JSPEC_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "jspec"
