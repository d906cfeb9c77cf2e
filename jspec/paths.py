"""Where jspec finds what it ships and keeps what it caches (no jax import: the CLI's --help reads it)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
# The shipped models: checkpoints/ beside the package in a clone (and an editable install), installed as the
# package jspec.checkpoints by `pip install .` (pyproject.toml maps the folder there).
CHECKPOINTS = next((p for p in (PACKAGE / "checkpoints", PACKAGE.parent / "checkpoints") if p.is_dir()),
                   PACKAGE.parent / "checkpoints")
# XLA's autotuning results (compile_cache.seed_autotune) for the shipped pair and the 8B-shaped benchmark program
# on an H200.
AUTOTUNE_DIR = PACKAGE / "autotune"


def cache_root() -> Path:
    """$JSPEC_CACHE_DIR, else cache_home()/jspec."""
    if os.environ.get("JSPEC_CACHE_DIR"):
        return Path(os.environ["JSPEC_CACHE_DIR"])
    return cache_home() / "jspec"


def cache_home() -> Path:
    """$XDG_CACHE_HOME, else $HOME/.cache, else the passwd entry's home/.cache: an empty or relative value counts
    as unset (HOME="" made it /.cache or ./.cache); with no home at all, a per-user directory under the temp dir."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return Path(xdg)
    home = os.environ.get("HOME", "")
    if not os.path.isabs(home):
        try:
            import pwd

            home = pwd.getpwuid(os.getuid()).pw_dir
        except (ImportError, KeyError, OSError):
            home = ""
    if os.path.isabs(home):
        return Path(home) / ".cache"
    return Path(tempfile.gettempdir()) / f"jspec-cache-{getattr(os, 'getuid', lambda: 'user')()}"
