"""A drafter from outside the package: defined here, registered by name, run by the Engine like a built-in one.

It proposes the last emitted token K times (no state, no weights). Over the INT2 cache in float32 its greedy
output equals plain decoding at batch 1 and 4, and some of its drafts are accepted (the target's output damped
into runs of one token, as test_speculative's "repeater"). Nothing under jspec/ knows it.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jspec.config import GenerateConfig, KVConfig, ModelConfig
from jspec.decode import drafters
from jspec.decode.state import Drafter
from jspec.model import decoder
from jspec.runtime.engine import Engine

CFG = ModelConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=16, max_position=64)
INT2 = KVConfig("int2", sink=2, recent=6, group_size=8)
K, MAX_NEW = 3, 16


@dataclasses.dataclass(frozen=True)
class RepeatLast(drafters.Proposer):
    """The last emitted token (`next`), K times; its q a point mass (sampling stays lossless)."""

    prior_alpha: float = 0.3

    def propose(self, m, s, sampler, keys):
        drafts = jnp.repeat(s.next[:, None], m.lookahead, axis=1)
        return drafts, drafters.point_mass(drafts, m.target_cfg.vocab_size, sampler), s.draft


drafters.register("repeat-last", RepeatLast())


class _Ids:
    """A tokenizer of ids: the text of tokens is their numbers (Engine.generate decodes every row's text)."""

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def _engine(drafter: Drafter) -> Engine:
    params = decoder.init_params(CFG, jax.random.key(0), std=0.3)
    params = params.replace(layers=params.layers.replace(wo=params.layers.wo * 0.03,
                                                             w_down=params.layers.w_down * 0.03))
    return Engine(cfg=CFG, params=params, tokenizer=_Ids(), kv=INT2, drafter=drafter, dtype="float32")


@pytest.mark.parametrize("batch", [1, 4])
def test_registered_drafter_equals_plain(batch):
    rng = np.random.default_rng(batch)
    ids = [rng.integers(2, CFG.vocab_size, n).tolist() for n in (9, 5, 12, 7)[:batch]]
    eng = _engine(Drafter(mode="repeat-last"))
    spec = eng.generate(ids, GenerateConfig(MAX_NEW, lookahead=K, stop_at_eos=False))
    plain = eng.generate(ids, GenerateConfig(MAX_NEW, lookahead=0, stop_at_eos=False))
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]
    assert all(len(r.token_ids) == MAX_NEW for r in spec)
    assert all(r.stats.draft_mode == "repeat-last" and r.stats.lookahead == K for r in spec)
    assert sum(r.stats.accepted for r in spec) > 0


def test_registry_refuses_a_built_in_name_and_composes_with_ngram():
    with pytest.raises(ValueError):
        drafters.register("model", RepeatLast())
    combined = drafters.proposer("ngram+repeat-last")
    assert isinstance(combined, drafters.Combined) and isinstance(combined.inner, RepeatLast)
    with pytest.raises(KeyError):
        drafters.proposer("no-such-drafter")


def test_load_names_a_registered_drafter():
    """load's draft argument takes a registered drafter without weights by name, alone or after "ngram+"."""
    from jspec.runtime import engine

    assert engine._load_drafter("repeat-last", None, CFG, None, jnp.float32).mode == "repeat-last"
    assert engine._load_drafter("ngram+repeat-last", None, CFG, None, jnp.float32).mode == "ngram+repeat-last"
