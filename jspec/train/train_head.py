"""Trains an EAGLE-3 head for a target on the target's own generations and exports it (jspec.io.eagle3).

    python -m jspec.train.train_head --target checkpoints/code-target --out checkpoints/code-head --time-budget 150

1. Data: windows of the stdlib corpus (jspec.train.data's train split, read with the target's tokenizer) as
   prompts, continued by the target itself inside jspec's decode program (half of the rows greedy, half
   sampled at temperature 0.8): the head learns the distribution it will be asked to predict.
2. Draft vocabulary: the --draft-vocab tokens the generations use most (EAGLE-3's choice), d2t mapping
   them back; the LM head starts from the target's own rows for them and fc from the top tap.
3. Training-time test (EAGLE-3): each step unrolls the head --ttt times. Unroll 0 reads the target's
   fused features; unroll k reads the head's own outputs of unroll k - 1, at position t + k, attending to
   the target-feature keys at positions <= t and to its own chain's keys of unrolls 1..k (what the decode
   loop's head cache holds at that point). The loss is the cross-entropy against the target's distribution
   (over the draft vocabulary) of the token each unroll predicts, weighted 0.8^k.
4. Time-bounded: generation takes at most --gen-share of --time-budget; training runs until the budget
   (less a reserve for the evaluation) with a cosine schedule on elapsed time. Then greedy decoding of
   held-out prompts with the head (K = 4) against plain decoding measures tau and the speed-up, and the
   head is written as config.json + model.safetensors (+ train_head.json with the figures).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jspec.config import GenerateConfig, KVConfig, ModelConfig, SamplingConfig
from jspec.decode.state import Drafter, DraftMode
from jspec.io import eagle3
from jspec.model import head
from jspec.model.decoder import Params, forward_taps, qkv
from jspec.model.head import HeadConfig, HeadParams
from jspec.runtime import engine
from jspec.train import data


@dataclasses.dataclass(frozen=True)
class HeadTrainConfig:
    time_budget: float = 150.0  # seconds for everything (generation, training, evaluation)
    gen_share: float = 0.3  # at most this share of the budget generates data
    eval_reserve: float = 25.0  # seconds kept for the evaluation and export
    prompt_len: int = 64
    gen_len: int = 192
    gen_batch: int = 256
    draft_vocab: int = 1024
    num_heads: int = 2
    num_kv_heads: int = 1
    intermediate_size: int = 256
    ttt: int = 3  # unrolls per step
    batch: int = 64
    lr: float = 1e-3
    warmup: int = 50
    eval_prompts: int = 8
    eval_new: int = 128
    seed: int = 0


def train_taps(num_layers: int) -> tuple[int, ...]:
    """Low, middle and high taps, all read by vLLM's capture too (indices < L): (1, L // 2, L - 1)."""
    return (1, num_layers // 2, num_layers - 1) if num_layers >= 4 else (0, 1, 2)


# ------------------------------------------------------------------------------------------- data


def prompt_windows(tokenizer, n: int, length: int, split: str, rng: np.random.Generator) -> np.ndarray:
    """n windows [n, length] of the stdlib corpus' split, in the target's tokens."""
    # read in this process (workers=1): a process pool forked after JAX has started threads may deadlock
    docs = data.corpus_documents(data.stdlib_root(), with_packages=False, workers=1)[0][split]
    order = rng.permutation(len(docs))
    stream, need = [], n * length * 4  # enough text that windows rarely repeat
    for i in order:
        stream.extend(tokenizer.encode(docs[i]))
        if len(stream) >= need:
            break
    stream = np.asarray(stream, np.int32)
    starts = rng.integers(0, len(stream) - length, n)
    return np.stack([stream[s:s + length] for s in starts])


def generate(eng: engine.Engine, prompts: np.ndarray, gen_len: int, batch: int, deadline: float, seed: int):
    """The target's continuations of the prompts (half greedy, half at temperature 0.8), batch by batch until
    the prompts or the time run out: int32 [N, prompt + gen_len]."""
    gen = GenerateConfig(max_new_tokens=gen_len, lookahead=0, stop_at_eos=False)
    out = []
    for i in range(0, len(prompts), batch):
        if out and time.perf_counter() > deadline:
            break
        rows = prompts[i:i + batch]
        sampling = [SamplingConfig(temperature=0.0 if j % 2 == 0 else 0.8, seed=seed + i + j) for j in range(len(rows))]
        res = eng.generate_ids([r.tolist() for r in rows], sampling, [gen_len] * len(rows), gen)
        out.extend(np.concatenate([r, np.asarray(t, np.int32)]) for r, (t, _) in zip(rows, res))
    return np.stack(out)


def draft_vocabulary(seqs: np.ndarray, vocab: int, size: int) -> np.ndarray:
    """d2t [size]: the `size` most frequent target tokens, ascending, as offsets from their draft index."""
    counts = np.bincount(seqs.ravel(), minlength=vocab)
    ids = np.sort(np.argsort(-counts, kind="stable")[:size])
    return (ids - np.arange(size)).astype(np.int32)


# --------------------------------------------------------------------------------------- the model


def init(hcfg: HeadConfig, target: Params, tcfg: ModelConfig, d2t, key) -> HeadParams:
    """Random head whose fc passes the top tap through and whose LM head is the target's, on the draft
    vocabulary: at step 0 it predicts like the target's own next-token head, a useful start."""
    hp = head.init_head(hcfg, key, jnp.float32, d2t=d2t)
    E = tcfg.hidden_size
    fc = hp.fc.at[-E:].add(jnp.eye(E))
    lm = (target.embed.T if target.lm_head is None else target.lm_head).astype(jnp.float32)
    ids = jnp.arange(hcfg.draft_vocab) + jnp.asarray(d2t)
    return hp.replace(fc=fc, lm_head=lm[:, ids], norm=target.norm.astype(jnp.float32))


def ttt_attention(q, keys, values, D: int):
    """Unroll k's attention: q [B, T, Hq, D]; keys/values [k + 1] x [B, T, Hkv, D], entry 0 the target-feature
    rows (causal: s <= t), entry j >= 1 the chain's unroll-j row of the same root t (its diagonal).
    Returns [B, T, Hq * D]."""
    B, T, Hq, _ = q.shape
    Hkv = keys[0].shape[2]
    qg = q.reshape(B, T, Hkv, Hq // Hkv, D).astype(jnp.float32)
    s0 = jnp.einsum("bthgd,bshd->bhgts", qg, keys[0].astype(jnp.float32))
    s0 = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s0, -jnp.inf)
    diag = [jnp.einsum("bthgd,bthd->bhgt", qg, k.astype(jnp.float32))[..., None] for k in keys[1:]]
    p = jax.nn.softmax(jnp.concatenate([s0, *diag], -1) * D**-0.5, axis=-1)  # [B, Hkv, g, T, T + k]
    o = jnp.einsum("bhgts,bshd->bthgd", p[..., :T], values[0].astype(jnp.float32))
    for j, v in enumerate(values[1:]):
        o = o + jnp.einsum("bhgt,bthd->bthgd", p[..., T + j], v.astype(jnp.float32))
    return o.reshape(B, T, Hq * D).astype(q.dtype)


def ttt_logits(hp: HeadParams, hcfg: HeadConfig, target: Params, tcfg: ModelConfig, seqs, ttt: int):
    """The head unrolled ttt times over seqs [B, T]: (per unroll k, logits [B, T, Vd] over the draft vocabulary
    for root t, which predict token t + k + 2; the target's logits [B, T, V], constants)."""
    T = seqs.shape[1]
    logits, _, tapped = jax.lax.stop_gradient(forward_taps(target, tcfg, seqs, None, hcfg.taps))
    feats = head.fuse(hp, tapped.astype(jnp.float32))
    cfg, keys, values, outs = hcfg.layer, [], [], []
    for k in range(ttt):
        tokens = jnp.pad(seqs[:, k + 1:], ((0, 0), (0, k + 1)))  # token t + k + 1 for root t
        x = head.qkv_input(hp, hcfg, target.embed.astype(jnp.float32), tokens, feats)
        q, kk, vv = qkv(hp.layer, cfg, x, jnp.arange(T)[None] + k)
        keys, values = keys + [kk], values + [vv]
        out, feats = head.finish(hp, hcfg, feats, ttt_attention(q, keys, values, cfg.head_dim))
        outs.append(out)
    return outs, logits


def ttt_loss(hp: HeadParams, hcfg: HeadConfig, target: Params, tcfg: ModelConfig, seqs, ttt: int):
    """(loss, step-0 top-1 agreement with the target) of one batch seqs [B, T] (see the module doc, 3)."""
    B, T = seqs.shape
    outs, logits = ttt_logits(hp, hcfg, target, tcfg, seqs, ttt)
    p = jax.nn.softmax(logits, -1)[..., jnp.arange(hcfg.draft_vocab) + hp.d2t]  # [B, T, Vd] of token t + 1
    p = p / jnp.maximum(p.sum(-1, keepdims=True), 1e-9)
    total, agree = 0.0, 0.0
    for k, out in enumerate(outs):
        label = jnp.pad(p[:, k + 1:], ((0, 0), (0, k + 1), (0, 0)))  # the target's distribution of token t + k + 2
        valid = (jnp.arange(T) < T - k - 1)[None, :]
        ce = -(label * jax.nn.log_softmax(out, -1)).sum(-1)
        total = total + 0.8**k * (ce * valid).sum() / (valid.sum() * B)
        if k == 0:
            agree = ((out.argmax(-1) == label.argmax(-1)) * valid).sum() / (valid.sum() * B)
    return total, agree


def make_step(hcfg: HeadConfig, tcfg: ModelConfig, tx, ttt: int):
    """One AdamW step on the head's float weights (d2t, the integer map, rides along unchanged)."""
    @jax.jit
    def step(hp, opt, target, seqs):
        loss_fn = lambda w: ttt_loss(w.replace(d2t=hp.d2t), hcfg, target, tcfg, seqs, ttt)
        (loss, agree), grads = jax.value_and_grad(loss_fn, has_aux=True)(hp.replace(d2t=None))
        updates, opt = tx.update(grads, opt, hp.replace(d2t=None))
        return optax.apply_updates(hp.replace(d2t=None), updates).replace(d2t=hp.d2t), opt, loss, agree

    return step


# ---------------------------------------------------------------------------------------- the run


def evaluate(eng: engine.Engine, hcfg: HeadConfig, hp: HeadParams, prompts: np.ndarray, new: int, K: int = 4) -> dict:
    """Greedy decoding of held-out prompts at batch 1 (BF16 KV), plain and with the head at lookahead K:
    tokens/s (decode time of the compiled program, summed over the prompts), tau = tokens per round, and
    which rows have the same output. In bfloat16 a row may differ where two logits tie within rounding (a
    verify forward over K + 1 tokens rounds differently from a one-token step; the draft model's rows
    differ at the same places); in float32 they are equal (tests/test_speculative.py)."""
    bf = jax.tree.map(lambda x: x.astype(jnp.bfloat16) if x.dtype == jnp.float32 else x, hp)
    eh = dataclasses.replace(eng, drafter=Drafter(head=bf, mode=DraftMode.HEAD, head_cfg=hcfg), _compiled={}, _costs={},
                             _seen={})
    out = {}
    for name, e, k in (("plain", eng, 0), ("head", eh, K)):
        gen = GenerateConfig(max_new_tokens=new, lookahead=k, stop_at_eos=False)
        call = lambda p: e.generate_ids([p.tolist()], [SamplingConfig()], [new], gen)[0]
        call(prompts[0])  # compile
        res = [call(p) for p in prompts]
        decode_s = sum(st.new_tokens / st.batch_tokens_per_s for _, st in res)
        out[name] = dict(tokens_per_s=round(sum(st.new_tokens for _, st in res) / decode_s, 1),
                         accept_length=round(float(np.mean([st.accept_length for _, st in res])), 3),
                         tokens=[t for t, _ in res])
    out["rows_equal_bf16"] = [a == b for a, b in zip(out["plain"].pop("tokens"), out["head"].pop("tokens"))]
    out["speedup"] = round(out["head"]["tokens_per_s"] / out["plain"]["tokens_per_s"], 3)
    out["K"] = K
    return out


def train(hp: HeadParams, hcfg: HeadConfig, eng: engine.Engine, seqs: np.ndarray, tc: HeadTrainConfig, stop: float,
          rng: np.random.Generator):
    """AdamW on random batches of seqs until time.perf_counter() passes stop (one step at least): warmup,
    then cosine decay on elapsed time. Returns (head, steps, [(step, loss, step-0 agreement)] every 50)."""
    start = time.perf_counter()
    lr = lambda step: tc.lr * min(1.0, (step + 1) / tc.warmup) * 0.5 * (
        1 + math.cos(math.pi * min(1.0, (time.perf_counter() - start) / max(stop - start, 1e-9))))
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.inject_hyperparams(optax.adamw)(learning_rate=tc.lr))
    opt = tx.init(hp.replace(d2t=None))
    step_fn = make_step(hcfg, eng.cfg, tx, tc.ttt)
    steps, curve = 0, []
    while steps == 0 or time.perf_counter() < stop:
        batch = jnp.asarray(seqs[rng.integers(0, len(seqs), tc.batch)])
        opt[1].hyperparams["learning_rate"] = jnp.asarray(lr(steps), jnp.float32)
        hp, opt, loss, agree = step_fn(hp, opt, eng.params, batch)
        steps += 1
        if steps % 50 == 1:  # a host sync every 50 steps only
            curve.append((steps, float(loss), float(agree)))
    return hp, steps, curve


def run(target_dir: Path, out_dir: Path, tc: HeadTrainConfig) -> dict:
    """Data, head, training, evaluation and export (module doc); returns the figures of train_head.json."""
    t0 = time.perf_counter()
    eng = engine.load(target_dir, draft=None, kv=KVConfig("bf16"), mesh=None)
    rng = np.random.default_rng(tc.seed)
    prompts = prompt_windows(eng.tokenizer, tc.gen_batch * 64, tc.prompt_len, "train", rng)  # more than time allows
    seqs = generate(eng, prompts, tc.gen_len, tc.gen_batch, t0 + tc.gen_share * tc.time_budget, tc.seed)
    gen_s = time.perf_counter() - t0
    d2t = draft_vocabulary(seqs, eng.cfg.vocab_size, min(tc.draft_vocab, eng.cfg.vocab_size))
    hcfg = HeadConfig(head.layer_config(eng.cfg, tc.num_heads, tc.num_kv_heads, tc.intermediate_size), len(d2t),
                      train_taps(eng.cfg.num_layers))
    hp = init(hcfg, eng.params, eng.cfg, d2t, jax.random.key(tc.seed))
    hp, steps, curve = train(hp, hcfg, eng, seqs, tc, t0 + tc.time_budget - tc.eval_reserve, rng)
    train_s = time.perf_counter() - t0 - gen_s
    val = prompt_windows(eng.tokenizer, tc.eval_prompts, tc.prompt_len, "val", np.random.default_rng(tc.seed + 1))
    coverage = float(np.isin(seqs, np.arange(len(d2t)) + d2t).mean())  # generated tokens the head can draft
    metrics = dict(evaluate(eng, hcfg, hp, val, tc.eval_new), sequences=len(seqs), tokens=int(seqs.size),
                   draft_vocab=len(d2t), draft_vocab_coverage=round(coverage, 4),
                   taps=list(hcfg.taps), steps=steps, loss_curve=curve, generate_s=round(gen_s, 1),
                   train_s=round(train_s, 1), config=dataclasses.asdict(tc))
    eagle3.save_head(out_dir, hcfg, hp, eng.cfg)
    metrics["bytes"] = sum(p.stat().st_size for p in out_dir.iterdir())
    metrics["total_s"] = round(time.perf_counter() - t0, 1)
    (out_dir / "train_head.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Train an EAGLE-3 head for a target on its own generations.")
    ap.add_argument("--target", type=Path, required=True, help="the target's HF directory")
    ap.add_argument("--out", type=Path, required=True, help="where the head directory is written")
    for f in dataclasses.fields(HeadTrainConfig):
        ap.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    ap.add_argument("--small", action="store_true", help="tiny settings for a CPU check (seconds)")
    a = ap.parse_args(argv)
    tc = HeadTrainConfig(**{f.name: getattr(a, f.name) for f in dataclasses.fields(HeadTrainConfig)})
    if a.small:
        tc = dataclasses.replace(tc, prompt_len=16, gen_len=16, gen_batch=4, draft_vocab=256, batch=4,
                                 eval_prompts=2, eval_new=16, eval_reserve=min(tc.eval_reserve, tc.time_budget / 2))
    metrics = run(a.target, a.out, tc)
    print(json.dumps({k: v for k, v in metrics.items() if k not in ("loss_curve", "config")}))


if __name__ == "__main__":
    main()
