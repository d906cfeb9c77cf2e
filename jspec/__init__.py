"""jspec: speculative decoding over an OSCAR 2-bit KV cache, in JAX and Pallas.

The exports are loaded on first use (PEP 562), so that `jspec generate --help` imports no jax and
`jspec calibrate` finds its module not yet imported.
"""

import importlib

__version__ = "0.2.0"

_EXPORTS = {
    "ConfigError": "jspec.config", "GenerateConfig": "jspec.config", "KVConfig": "jspec.config",
    "ModelConfig": "jspec.config", "SamplingConfig": "jspec.config",
    "Engine": "jspec.runtime.engine", "Result": "jspec.runtime.engine", "load": "jspec.runtime.engine",
    "calibrate": "jspec.model.calibrate",  # the module: calibrate.calibrate(params, cfg, batches)
    "ray": "jspec.jobs.ray_jobs",  # the module: ray.run_job, a job on a Ray cluster (pip install -e ".[ray]")
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'jspec' has no attribute {name!r}")
    module = importlib.import_module(_EXPORTS[name])
    value = module if name in ("calibrate", "ray") else getattr(module, name)
    globals()[name] = value  # cached: __getattr__ runs once per name
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
