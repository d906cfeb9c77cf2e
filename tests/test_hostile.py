"""Hostile inputs to configs, checkpoints, rotation and cache files and the calibration CLI: one test per class
(numbered as in the issue). Each bad input is refused with one clear error naming the problem, or handled
correctly; never a traceback and never silently wrong output.

Tiny models (conftest.hf_model_dir) and no compiled decoding loop: these run in seconds on a CPU.
"""

from __future__ import annotations

import numpy as np

from jspec.config import GenerateConfig, KVConfig, SamplingConfig
from jspec.engine import capacity_bucket


def test_numpy_scalars_in_run_configs_become_python_numbers():
    """Class 15: np.int64(2) and friends pass validation and then behave as ints and floats everywhere."""
    gen = GenerateConfig(max_new_tokens=np.int32(8), lookahead=np.int64(2), stop_at_eos=True)
    sampling = SamplingConfig(temperature=np.float32(0.5), top_k=np.uint8(3), top_p=np.float64(0.9),
                              seed=np.int64(7))
    kv = KVConfig(sink=np.int16(4), recent=np.int64(32), group_size=np.int64(8), clip_k=np.float32(0.5))
    for cfg in (gen, sampling, kv):
        for name, value in vars(cfg).items():
            assert type(value) in (int, float, str, bool, type(None)), (name, type(value))
    gen.validate(), sampling.validate(), kv.validate(head_dim=16, lookahead=2)
    assert capacity_bucket(gen.max_new_tokens + gen.lookahead + 1, 256) == 16
    assert hash(gen) == hash(GenerateConfig(max_new_tokens=8, lookahead=2))
