"""jspec: speculative decoding over an OSCAR 2-bit KV cache, in JAX and Pallas."""

from jspec.config import ConfigError, GenerateConfig, KVConfig, ModelConfig, SamplingConfig
from jspec.engine import Engine, Result, load

__all__ = ["ConfigError", "Engine", "GenerateConfig", "KVConfig", "ModelConfig", "Result", "SamplingConfig",
           "calibrate", "load"]


def calibrate(*args, **kwargs):
    """OSCAR rotation calibration; see jspec.calibrate.calibrate."""
    from jspec.calibrate import calibrate as _calibrate

    return _calibrate(*args, **kwargs)
