"""Where a benchmark writes when no --out is given: a scratch folder, never the tracked benchmarks/results/
(the landed figures change only when a command names their file: benchmarks/run_gpu.sh does)."""

import tempfile
from pathlib import Path


def default_out(name: str = "") -> Path:
    """<tmp>/jspec-bench/<name> (the folder itself without a name), the folder created."""
    folder = Path(tempfile.gettempdir()) / "jspec-bench"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name if name else folder
