"""--lookahead auto (jspec/lookahead.py): the speed-up model, the choice of K (0 included), the acceptance
estimate, and the engine's use of them: costs measured once and cached on disk, output unchanged."""

import jax
import pytest

import jspec
from jspec.decode import drafters
from jspec.runtime import lookahead, programs
from jspec.runtime.lookahead import Costs, choose, expected_tokens, speedup

MODES = ("model", "ngram", "ngram+model")
# A launch-bound pair (the shipped one on an H200): verifying 17 tokens costs 10% more than 1, a
# draft-model token half a target step, a lookup 2%.
LAUNCH = Costs(((1, 1.0), (5, 1.02), (17, 1.1)), draft_step=0.5, ngram=0.02)


def test_speedup_formula():
    c = Costs(((1, 2.0), (5, 2.0), (17, 3.0)), draft_step=0.5, ngram=0.1)
    assert c.verify_at(11) == pytest.approx(2.5)  # interpolated between measured points
    assert expected_tokens(0.5, 2) == pytest.approx(1.75) and expected_tokens(1.0, 3) == 4
    assert speedup(c, "ngram", 0.5, 2) == pytest.approx(1.75 * 2 / (0.1 + 2.0))
    assert speedup(c, "model", 0.5, 2) == pytest.approx(1.75 * 2 / (2 * 0.5 + 2.0))
    assert speedup(c, "ngram+model", 0.5, 2) == pytest.approx(1.75 * 2 / (0.1 + 2 * 0.5 + 2.0))
    assert speedup(c, "model", 0.9, 0) == 1.0


def test_worthless_drafts_choose_no_speculation():
    for mode in MODES:
        assert choose(LAUNCH, mode, 0.0, 16) == (0, 1.0)
    assert choose(LAUNCH, "model", 0.35, 16) == (0, 1.0)  # the shipped draft: 1.35 / 1.5 steps
    assert choose(LAUNCH, "ngram", 0.04, 16) == (0, 1.0)  # a gain under MIN_GAIN is not worth the risk
    compute = Costs(((1, 1.0), (5, 4.0), (17, 16.0)))  # the verify cost grows with its tokens (a CPU)
    assert choose(compute, "ngram", 0.7, 16) == (0, 1.0)


def test_favourable_costs_choose_speculation():
    K, gain = choose(LAUNCH, "ngram", 0.3, 16)
    assert 2 <= K <= 6 and gain == pytest.approx(speedup(LAUNCH, "ngram", 0.3, K)) and gain > lookahead.MIN_GAIN
    assert choose(LAUNCH, "ngram", 0.9, 16)[0] == 16  # copies accepted 9 in 10: the longest lookahead
    assert choose(LAUNCH, "ngram", 0.9, 5)[0] == 4  # bounded (the largest candidate <= 5)
    assert choose(LAUNCH, "ngram", 0.9, 0) == (0, 1.0)
    assert choose(LAUNCH, "model", 0.8, 16)[0] >= 1
    for K in lookahead.CANDIDATES:  # no better K was missed
        assert speedup(LAUNCH, "ngram", 0.3, K) <= gain + 1e-12


def test_acceptance_estimate():
    for alpha in (0.05, 0.4, 0.9):
        for K in (1, 4, 16):
            assert lookahead.alpha_from_accepted(expected_tokens(alpha, K) - 1, K) == pytest.approx(alpha, abs=1e-6)
    seen = (0, 0)
    assert lookahead.estimate("ngram", seen) == (drafters.proposer("ngram").prior_alpha, "prior")
    assert lookahead.observe(seen, 0, 10, 0) == seen  # no drafts, nothing learnt
    seen = lookahead.observe(seen, 4, 100, 400)  # every draft accepted
    alpha, source = lookahead.estimate("ngram", seen)
    assert alpha > 0.95 and source == "400 drafts measured"


def test_batch_learns_from_its_slowest_row():
    """A batch runs until its slowest row is done: two rows that emitted 9 tokens, one in 2 rounds (all 4+4
    drafts taken), one in 8 rounds (none taken), teach the acceptance of the slow one, and a larger batch
    starts from a lower prior."""
    slow = lookahead.observe((0, 0), 4, 8, 0)
    assert lookahead.observe_batch((0, 0), 4, [2, 8], [9, 9]) == slow
    assert lookahead.estimate("ngram", slow)[0] < drafters.proposer("ngram").prior_alpha
    assert lookahead.observe_batch((0, 0), 4, [], []) == (0, 0)
    priors = [lookahead.prior("model", B) for B in (1, 8, 64)]
    assert priors[0] == drafters.proposer("model").prior_alpha and priors[0] > priors[1] > priors[2] >= 0
    assert [lookahead.batch_bucket(B) for B in (1, 2, 3, 8, 9)] == [1, 2, 4, 8, 16]


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("JSPEC_CACHE_DIR", str(tmp_path))
    return tmp_path


def _load(hf_model_dir, draft="ngram"):
    return jspec.load(hf_model_dir("llama"), draft=draft, kv=jspec.KVConfig("bf16"), dtype="float32")


PROMPT = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]
COST_LOOPS = [] if jax.default_backend() == "cpu" else [4]  # cost loops compiled: none where estimated (the CPU)


def test_auto_measures_once_and_caches_on_disk(hf_model_dir, cache_root, monkeypatch):
    batches, compile_all = [], programs.compile_all
    monkeypatch.setattr(programs, "compile_all",
                        lambda lowered, *a: batches.append(len(lowered)) or compile_all(lowered, *a))
    [r] = _load(hf_model_dir).generate([PROMPT], jspec.GenerateConfig(max_new_tokens=4))
    # verify at 1, 5 and 17 tokens and the n-gram lookup compiled side by side (on a GPU: the CPU estimates them
    # from their cost analysis, lookahead.CPU_FLOPS), then the generate program's two parts (prefill, rounds)
    assert batches == COST_LOOPS + [2]
    auto = r.stats.lookahead_auto
    assert auto["K"] == r.stats.lookahead and auto["mode"] == "ngram" and auto["alpha_from"] == "prior"
    ms = auto["costs_ms"]
    assert set(ms["verify"]) == {"1", "5", "17"} and min(ms["verify"].values()) > 0
    assert ms["ngram"] > 0 and ms["draft_step"] == 0
    assert auto["measure_s"] > 0  # lowering the 4 loops (and on a GPU compiling and timing them)
    files = sorted(p.name.split("-")[0] for p in (cache_root / "lookahead").glob("*.json"))
    assert files == ["ngram", "verify"]  # one file per part: verify times serve every draft mode

    batches.clear()  # a new engine (a new process) reads the costs back: it compiles its generate program only
    [again] = _load(hf_model_dir).generate([PROMPT], jspec.GenerateConfig(max_new_tokens=4))
    assert batches == [2]
    assert again.stats.lookahead_auto["costs_ms"] == ms
    assert again.stats.lookahead_auto["measure_s"] < auto["measure_s"] / 10  # read from disk


def test_cost_shape():
    assert lookahead.cost_shape(144, 16) == (128, 111)  # the power of two at or below, nearly full
    assert lookahead.cost_shape(256, 16) == (256, 239) and lookahead.cost_shape(511, 16) == (256, 239)
    assert lookahead.cost_shape(48, 16) == (48, 31)  # 32 < 2 (16 + 1): its own shape
    assert lookahead.cost_shape(48, 4) == (32, 27)


def test_calls_within_a_power_of_two_of_capacity_share_one_measurement(hf_model_dir, cache_root, monkeypatch):
    shapes, measure = [], lookahead.measure
    monkeypatch.setattr(lookahead, "measure", lambda *a, **kw: shapes.append(a[3:5]) or measure(*a, **kw))
    eng = _load(hf_model_dir)
    first, second = (eng.generate([PROMPT], jspec.GenerateConfig(max_new_tokens=n))[0] for n in (40, 60))
    assert eng.capacity(jspec.GenerateConfig(max_new_tokens=40, lookahead=16), [len(PROMPT)], [40]) != \
        eng.capacity(jspec.GenerateConfig(max_new_tokens=60, lookahead=16), [len(PROMPT)], [60])  # two buckets
    assert shapes == [(64, 47)] * 2  # one cost shape for both
    assert second.stats.lookahead_auto["costs_ms"] == first.stats.lookahead_auto["costs_ms"]
    assert second.stats.lookahead_auto["measure_s"] < first.stats.lookahead_auto["measure_s"] / 10


def test_auto_speculates_when_it_pays_and_output_is_unchanged(hf_model_dir, cache_root, monkeypatch):
    flat = Costs(((1, 1e-3), (17, 1e-3)), ngram=1e-5)  # verifying 17 tokens costs what 1 does
    monkeypatch.setattr(lookahead, "measure", lambda *args, **kw: flat)
    eng = _load(hf_model_dir)
    gen = jspec.GenerateConfig(max_new_tokens=12)
    [auto] = eng.generate([PROMPT], gen)
    [plain] = eng.generate([PROMPT], jspec.GenerateConfig(max_new_tokens=12, lookahead=0))
    assert auto.stats.lookahead > 0 and plain.stats.lookahead == 0 and plain.stats.lookahead_auto is None
    assert auto.token_ids == plain.token_ids
    [again] = eng.generate([PROMPT], gen)  # the first call's acceptance now informs the choice
    measured = auto.stats.rounds * auto.stats.lookahead
    assert again.stats.lookahead_auto["alpha_from"] == f"{measured} drafts measured"
    assert again.token_ids == plain.token_ids


def test_auto_without_a_drafter_measures_nothing(hf_model_dir, cache_root, monkeypatch):
    monkeypatch.setattr(lookahead, "measure", None)  # would fail if called
    [r] = _load(hf_model_dir, draft="none").generate([PROMPT], jspec.GenerateConfig(max_new_tokens=4))
    assert r.stats.lookahead == 0 and r.stats.draft_mode == "none" and r.stats.lookahead_auto is None


def test_plan_runs_once_per_call(hf_model_dir, cache_root, monkeypatch):
    """A generate call with lookahead "auto" plans once: prepare takes the planned lookahead as it is."""
    flat = Costs(((1, 1e-3), (17, 1e-3)), ngram=1e-5)
    monkeypatch.setattr(lookahead, "measure", lambda *args, **kw: flat)
    eng, calls = _load(hf_model_dir), []
    plan = type(eng).plan
    monkeypatch.setattr(type(eng), "plan", lambda self, *a: calls.append(a) or plan(self, *a))
    [r] = eng.generate([PROMPT], jspec.GenerateConfig(max_new_tokens=4))
    assert len(calls) == 1 and r.stats.lookahead > 0


def test_costs_read_back_from_their_milliseconds():
    c = Costs(((1, 2e-3), (5, 2.5e-3)), draft_step=5e-4, ngram=1e-5, head_step=3e-4, self_step=2e-3,
              other=(("self_skip", 1.5e-3),))
    back = Costs.from_ms(c.as_ms())
    assert [n for n, _ in back.verify] == [1, 5] and [t for _, t in back.verify] == pytest.approx([2e-3, 2.5e-3])
    assert [back.step(n) for n in ("draft", "ngram", "head", "self", "self_skip")] == pytest.approx(
        [5e-4, 1e-5, 3e-4, 2e-3, 1.5e-3])
