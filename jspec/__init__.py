"""jspec: speculative decoding over an OSCAR 2-bit KV cache, in JAX and Pallas."""

from jspec import calibrate  # the module: calibrate.calibrate(params, cfg, batches), and its CLI
from jspec.config import ConfigError, GenerateConfig, KVConfig, ModelConfig, SamplingConfig
from jspec.engine import Engine, Result, load

__all__ = ["ConfigError", "Engine", "GenerateConfig", "KVConfig", "ModelConfig", "Result", "SamplingConfig",
           "calibrate", "load"]

