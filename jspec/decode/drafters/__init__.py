"""The drafters: whatever proposes a round's K drafts, one module each, all speaking one protocol
(base.Proposer) and found by name (registry). The built-in ones:

- none: plain decoding (base.Proposer's defaults: no drafts);
- model: a small draft model over its own cache (model.py);
- ngram: prompt lookup over the prompt and the tokens emitted so far (ngram.py);
- head: an EAGLE-3 head on the target's own hidden states (head.py);
- self: the target over the BF16 window of its own cache and a per-round scratch (self_draft.py);
- self-skip: the target's first N layers (Drafter.layers), its norm and head, over the self-draft's view
  (self_skip.py);
- ngram+X: the n-gram copy where a row has a match, X elsewhere (combined.py; ngram+model and ngram+self built
  in, any other X registered gives one too).
A copied draft's q is a point mass, so sampling stays lossless. The draft model's and the head's caches may be
windowed (Drafter.cache_kv): the same drafters, whose forwards then attend the window alone.
"""

from jspec.decode.drafters.base import Chunk, Place, Probe, Proposer, draw, pick, point_mass
from jspec.decode.drafters.combined import Combined
from jspec.decode.drafters.head import Head, draw_head, head_token
from jspec.decode.drafters.model import DraftModel, model_token
from jspec.decode.drafters.ngram import NGram
from jspec.decode.drafters.registry import built_in, names, of, proposer, register
from jspec.decode.drafters.self_draft import SelfDraft, new_scratch, self_token
from jspec.decode.drafters.self_skip import SelfSkip

built_in("none", Proposer())
built_in("model", DraftModel())
built_in("ngram", NGram())
built_in("head", Head())
built_in("self", SelfDraft())
built_in("self-skip", SelfSkip())
# a little under the shipped pair's acceptance on held-out code (greedy, K = 4: ngram+model 0.68 at batch 8);
# ngram+self: 3.3-3.7 tokens per round over the shipped target's window, alpha 0.79-0.85 (as self_draft's)
built_in("ngram+model", Combined(inner=DraftModel(), prior_alpha=0.55))
built_in("ngram+self", Combined(inner=SelfDraft(), prior_alpha=0.7))


def init_cache(drafter, batch: int, capacity: int, dtype, K: int):
    """The empty cache a drafter's programs take (ProgramArgs.draft_cache), or None: none at K = 0."""
    return proposer(drafter.mode).init_cache(drafter, batch, capacity, dtype, K) if K else None


__all__ = ["Chunk", "Combined", "DraftModel", "Head", "NGram", "Place", "Probe", "Proposer", "SelfDraft",
           "SelfSkip", "draw", "draw_head", "head_token", "init_cache", "model_token", "names", "new_scratch", "of",
           "pick", "point_mass", "proposer", "register", "self_token"]
