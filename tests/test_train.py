"""Training resumes from its orbax checkpoint; the shipped pair and its tokenizer load (jspec and HF)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jspec.config import ModelConfig
from jspec.train import data, train

CHECKPOINTS = Path(__file__).resolve().parents[1] / "checkpoints"
TINY = ModelConfig(model_type="qwen3", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1,
                   num_heads=2, num_kv_heads=1, head_dim=16, max_position=64, tie_embeddings=True, qk_norm=True)


def _stream(n, seed):
    return np.random.default_rng(seed).integers(0, TINY.vocab_size, n).astype(np.uint16)


def test_train_two_steps_then_resume(tmp_path):
    tc = train.TrainConfig(steps=2, batch=2, seq_len=16, warmup=1, eval_every=2, save_every=2)
    stream, val = _stream(512, 0), _stream(64, 1)
    first = train.train(TINY, tc, tmp_path, stream, val)
    assert int(first.step) == 2 and np.isfinite(float(first.best_val))

    tx = train.make_optimizer(tc)
    restored = train.restore_or_init(train.checkpoint_manager(tmp_path, tc), TINY, tc, tx)
    assert int(restored.step) == 2
    for a, b in zip(jax.tree.leaves(first.params), jax.tree.leaves(restored.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    resumed = train.train(TINY, train.dataclasses.replace(tc, steps=3), tmp_path, stream, val)
    assert int(resumed.step) == 3  # continued from 2, not restarted
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(first.params), jax.tree.leaves(resumed.params)))


def test_schedule_warms_up_then_decays():
    tc = train.TrainConfig(steps=100, lr=1.0, warmup=10, min_lr_frac=0.1)
    assert train.learning_rate(tc, 0, 0.0) == pytest.approx(0.1)
    assert train.learning_rate(tc, 50, 0.5) == pytest.approx(0.55)
    assert train.learning_rate(tc, 99, 1.0) == pytest.approx(0.1)
    assert train.progress(train.dataclasses.replace(tc, time_budget=10.0), 5, 8.0) == pytest.approx(0.8)


def test_corpus_split_is_stable_and_excludes_tests():
    files = data.corpus_files(data.stdlib_root())
    assert files and not any(set(f.split("/")[:-1]) & {"test", "tests", "idle_test"} for f in files)
    val = [f for f in files if data.is_validation(f)]
    assert len(val) >= 0.02 * len(files)
    # A pure function of the path: another process (another str hash salt) splits the same way.
    code = ("import json, sys; from jspec.train import data; "
            "print(json.dumps([data.is_validation(f) for f in json.load(sys.stdin)]))")
    env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    out = subprocess.run([sys.executable, "-c", code], input=json.dumps(files), env=env, capture_output=True,
                         text=True, check=True).stdout
    assert json.loads(out) == [f in set(val) for f in files]


def _shipped(name):
    path = CHECKPOINTS / name
    if not (path / "model.safetensors").is_file():
        pytest.skip(f"{path} is not shipped yet")
    return path


def test_shipped_tokenizer_round_trips():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(_shipped("code-target")))
    text = "def fibonacci(n):\n    if n < 2:\n        return n  # ünïcode\n\treturn fibonacci(n - 1)\n"
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id and tok.eos_token_id is not None
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert len(tok) == data.VOCAB_SIZE


@pytest.mark.parametrize("name", ["code-target", "code-draft"])
def test_shipped_model_matches_transformers(name):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    from jspec.io.checkpoint import load_model
    from jspec.model.decoder import forward

    path = _shipped(name)
    cfg, params, tok = load_model(path, jnp.float32)
    assert cfg.eos_token_ids == (tok.eos_token_id,) and cfg.max_position >= 2048
    ids = tok("import os\n\ndef main(argv):\n    for arg in argv:\n        print(os.path.join(arg))\n")["input_ids"]
    ours, _ = forward(params, cfg, jnp.asarray([ids]))
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits.numpy()
    assert np.abs(np.asarray(ours) - theirs).max() <= 1e-3


@pytest.mark.parametrize("name", ["code-target", "code-draft"])
def test_shipped_model_round_trips_exactly(name, tmp_path):
    """The shipped bf16 tensors -> jspec's fused layout -> save_hf: the same tensors, bit for bit."""
    from safetensors.flax import load_file

    from jspec.io.checkpoint import load_model, save_hf

    path = _shipped(name)
    cfg, params, _ = load_model(path, jnp.bfloat16, tokenizer=False)
    save_hf(tmp_path, params, cfg)
    want, got = load_file(path / "model.safetensors"), load_file(tmp_path / "model.safetensors")
    assert got.keys() == want.keys()
    for k, x in want.items():
        assert got[k].dtype == x.dtype and bool(jnp.array_equal(got[k], x)), k


def test_distillation_loss_is_kl_to_the_teacher():
    """KL(teacher || model) is 0 for the teacher itself and positive for another model; a run with init
    params starts from them (the distilled draft starts from the pre-trained one)."""
    params = train.init_params(TINY, jax.random.key(0), jnp.float32)
    other = train.init_params(TINY, jax.random.key(1), jnp.float32)
    teacher = (TINY, jax.tree.map(lambda x: x.astype(jnp.bfloat16), params))
    windows = jnp.asarray(_stream(34, 2).reshape(2, 17).astype(np.int32))
    assert float(jnp.abs(train.token_losses(params, TINY, windows, teacher)).max()) < 1e-6
    assert float(train.token_losses(other, TINY, windows, teacher).mean()) > 1e-3

    tc = train.TrainConfig(steps=2, batch=2, seq_len=16)
    state = train.init_state(TINY, tc, train.make_optimizer(tc), init=other)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(other)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


_DATA_PARALLEL = """
import sys
import jax, numpy as np
sys.path.insert(0, sys.argv[2])
import test_train as t
state = t._dp_step()
leaves = jax.tree.leaves(state.params)
assert jax.device_count() == 2 and all(len(x.sharding.device_set) == 2 for x in leaves)
try:
    t.train.data_parallel(3)
    raise AssertionError("an odd batch was split over 2 devices")
except ValueError as e:
    assert "does not split" in str(e)
np.savez(sys.argv[1] + "/params.npz", *[np.asarray(x) for x in leaves])
"""


def _dp_step():
    """One train step of TINY on 2 rows, placed as jspec.train.train.train places them (data_parallel)."""
    tc = train.TrainConfig(batch=2, seq_len=16)
    tx = train.make_optimizer(tc)
    replicated, by_rows = train.data_parallel(tc.batch)
    state = jax.device_put(train.init_state(TINY, tc, tx), replicated)
    windows = data.sample_batch(_stream(512, 0), tc.batch, tc.seq_len, np.random.default_rng(0))
    return train.make_train_step(TINY, tx)(state, jax.device_put(windows, by_rows), 1e-3, None)[0]


def test_data_parallel_matches_one_device(tmp_path):
    """Two (fake CPU) devices, one row each, give the params one device gives: the batch is split by
    rows, the params replicated, and the gradients summed over both."""
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"  # conftest's kept
    env = dict(os.environ, XLA_FLAGS=flags.strip(), JAX_PLATFORMS="cpu",
               PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.run([sys.executable, "-c", _DATA_PARALLEL, str(tmp_path), str(Path(__file__).parent)],
                          env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    one, two = jax.tree.leaves(_dp_step().params), np.load(tmp_path / "params.npz")
    init = jax.tree.leaves(train.init_params(TINY, jax.random.key(0), jnp.float32))
    # bf16 forwards of 1 and 2 rows round differently, and Adam turns a near-zero gradient into a full
    # step of either sign: on average the runs must agree to a small fraction of how far the params
    # moved (a gradient of one row, or of rows not summed, misses by about the whole move).
    for i, (x, x0) in enumerate(zip(one, init)):
        moved, diff = np.abs(np.asarray(x) - x0).mean(), np.abs(two[f"arr_{i}"] - np.asarray(x)).mean()
        assert diff < 0.1 * moved, (i, diff, moved)


def test_unlikelihood_penalizes_recent_tokens_other_than_the_target():
    """Against a loop-by-loop reference: -log(1 - p(c)) over the set of inputs of the last n
    positions, the next token excluded."""
    rng = np.random.default_rng(3)
    windows = jnp.asarray(rng.integers(0, 5, (2, 9)).astype(np.int32))  # a vocabulary of 5: many repeats
    logits = jnp.asarray(rng.normal(size=(2, 8, 5)).astype(np.float32))
    p = np.exp(np.asarray(jax.nn.log_softmax(logits, -1)))
    w = np.asarray(windows)
    want = np.zeros((2, 8))
    for b in range(2):
        for t in range(8):
            for c in set(w[b, max(0, t - 2):t + 1].tolist()):
                want[b, t] += -np.log(1 - p[b, t, c]) if c != w[b, t + 1] else 0.0
    np.testing.assert_allclose(np.asarray(train.unlikelihood_losses(logits, windows, 3)), want, rtol=1e-5)
    assert want.min() >= 0 and want.max() > 0


def test_unlikelihood_adds_to_the_cross_entropy():
    params = train.init_params(TINY, jax.random.key(0), jnp.float32)
    windows = jnp.asarray(_stream(34, 4).reshape(2, 17).astype(np.int32))
    ce, both = train.token_losses(params, TINY, windows), train.token_losses(params, TINY, windows, None, 0.5, 4)
    logits, _ = train.forward(jax.tree.map(lambda x: x.astype(jnp.bfloat16), params), TINY, windows[:, :-1])
    np.testing.assert_allclose(both, ce + 0.5 * train.unlikelihood_losses(logits, windows, 4), rtol=1e-5)
    assert float((both - ce).mean()) > 0
