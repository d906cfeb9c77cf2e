"""Stop strings (jspec/stops.py): the on-device check against a brute-force reference over random token
streams, the tokenizer byte tables (byte-level, sentencepiece metaspace with byte fallback, a tokenizer whose
decode is not concatenative: found on the host), and whole runs on a tiny model: the text is the plain
run's text cut at the first stop, the row stops in the round that completes it (with a draft model accepting
every token, and with the n-gram drafter), and finish_reason says why.
"""

from __future__ import annotations

import dataclasses
import functools
import types

import jax
import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

from jspec.decode import stops
from jspec.io import tokenizer
from jspec.runtime import engine
from jspec.config import ConfigError, GenerateConfig, KVConfig, SamplingConfig

# --- the device check alone, against brute force ---------------------------------------------------------

V, W, B, N = 40, 8, 8, 4  # vocabulary, table width, rows, tokens a round may emit


def _table(seed: int) -> stops.TokenBytes:
    """Random token bytes over a small alphabet (matches are frequent): some tokens empty, some with a lead
    byte they lose when they start the text, some with a two-byte character."""
    rng = np.random.default_rng(seed)
    raws = [b"".join(rng.choice([b"a", b"b", b"\n", b" ", "é".encode()], rng.integers(0, 4))) for _ in range(V)]
    leads = [int(r[:1] == b" ") for r in raws]
    return stops._pack_table(raws, leads)


def _first_stop(tb, ids, stop: list[bytes]):
    """Brute force: the index of the token through which the row's bytes first hold a stop string, or None."""
    for k in range(len(ids)):
        text = stops.text_bytes(tb, ids[: k + 1])
        if any(s in text for s in stop):
            return k
    return None


_advance = jax.jit(stops.advance)


def test_advance_matches_brute_force_over_random_streams():
    """Rounds of 0..N tokens per row: a stop spanning tokens, several stops per row, a stop inside a round's
    run of tokens; the row is cut after the token that completes the first stop, never later or earlier."""
    for seed in range(3):
        tb, rng = _table(seed), np.random.default_rng(100 + seed)
        streams = rng.integers(0, V, (B, 40))
        row_stops = []
        for b in range(B):  # pieces of the row's own bytes (found), and strings that may not be there
            text = stops.text_bytes(tb, streams[b])
            picks = [text[i : i + n] for i, n in zip(rng.integers(0, max(len(text) - 4, 1), 2), rng.integers(2, 5, 2))]
            row_stops.append(tuple(s.decode("utf-8", "ignore") for s in picks + [b"\n\n\n", b"ab a"]
                                   if s.decode("utf-8", "ignore")))
        row_stops[0] = ()  # a row without stop strings
        st = stops.start(stops.Stops(**stops.pack(tb, row_stops)))
        count, done = np.zeros(B, int), np.zeros(B, bool)
        while not done.all() and count.max() < 40 - N:
            n_emit = np.where(done, 0, rng.integers(0, N + 1, B))
            seq = np.stack([streams[b, count[b] : count[b] + N] for b in range(B)])
            cut, hit, st = _advance(st, seq.astype(np.int32), n_emit.astype(np.int32))
            count += np.asarray(cut)
            done |= np.asarray(hit)
        for b in range(B):
            want = _first_stop(tb, list(streams[b]), [s.encode() for s in row_stops[b]])
            if done[b]:
                assert want is not None and count[b] == want + 1, (seed, b, count[b], want)
            else:
                assert want is None or want >= count[b], (seed, b, count[b], want)


def test_truncate_at_the_first_completed_stop_and_cut_ids():
    assert stops.truncate("abcdef", ("cd", "zz")) == ("ab", True)
    assert stops.truncate("abcdef", ("abcd", "c")) == ("ab", True)  # "c" completes first
    assert stops.truncate("abcdef", ("bc", "abc")) == ("", True)  # a tie: the one that starts first
    assert stops.truncate("abc", ()) == ("abc", False) and stops.truncate("abc", ("x",)) == ("abc", False)
    decode = lambda ids: "".join("ab c"[i] for i in ids)
    assert stops.cut_ids(decode, [0, 1, 2, 3, 0], ("b c",)) == [0, 1, 2, 3]
    assert stops.cut_ids(decode, [0, 1], ("z",)) == [0, 1]


@pytest.mark.parametrize("stop,message", [(("",), "must not be empty"), (("x",) * 17, "at most 16"),
                                          (("é" * 33,), "at most 64 UTF-8 bytes"), ((1,), "tuple of strings"),
                                          (["a", 2], "tuple of strings"), (("\ud800",), "lone surrogate")])
def test_stop_strings_are_validated(stop, message):
    with pytest.raises(ConfigError, match=message):
        GenerateConfig(stop=stop).validate()


# --- tokenizer tables -------------------------------------------------------------------------------------


def _check_table(tok, vocab: int):
    """The table exists and reproduces decode (special tokens skipped) of random sequences of the tokens that
    decode whole, and of texts' tokens (characters in byte pieces included)."""
    tb = stops.token_bytes(tok, vocab)
    assert tb is not None
    whole = [t for t in range(vocab) if "\ufffd" not in tok.decode([t])]
    texts = ["hello world, hello\n", " héllo wörld € 😀", "worldhello  ,"]
    for ids in [*np.random.default_rng(7).choice(whole, (50, 30)), *(tok.encode(t) for t in texts)]:
        assert stops.text_bytes(tb, ids).decode("utf-8", "replace") == tok.decode(ids, skip_special_tokens=True)
    return tb


def _sentencepiece_like(kind: str):
    """A BPE over metaspace pieces with byte fallback, as Llama 2 ("strip": Replace/ByteFallback/Fuse/Strip
    decoders) or newer sentencepiece conversions ("metaspace") build it: decoding a token alone drops its
    leading space, so the per-token decode is not concatenative."""
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for piece in ["▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "▁w", "ll", "▁he", "llo", "▁hello", "or", "ld",
                  "▁wor", "▁world", ",", "\n"]:
        vocab.setdefault(piece, len(vocab))
    merges = [("▁", "h"), ("▁", "w"), ("l", "l"), ("▁h", "e"), ("ll", "o"), ("▁he", "llo"), ("o", "r"),
              ("l", "d"), ("▁w", "or"), ("▁wor", "ld")]
    tok = Tokenizer(models.BPE(vocab, merges, byte_fallback=True, unk_token="<unk>"))
    if kind == "metaspace":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
        tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(prepend_scheme="first")])
    else:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


@pytest.mark.parametrize("kind", ["metaspace", "strip"])
def test_sentencepiece_tables_carry_the_dropped_leading_space(kind):
    tok = _sentencepiece_like(kind)
    V = len(tok.get_vocab())
    tb = _check_table(tok, V)
    hello = tok.convert_tokens_to_ids("▁hello")
    assert tok.decode([hello]) == "hello" and tb.table[hello, : tb.lens[hello]].tobytes() == b" hello"
    assert tb.lead[hello] == 1
    euro = [tok.convert_tokens_to_ids(f"<0x{b:02X}>") for b in "€".encode()]  # a character in byte pieces
    assert [tb.table[t, 0] for t in euro] == list("€".encode()) and tok.decode(euro) == "€"


def test_byte_level_table_and_a_cleanup_tokenizer_falls_back_to_the_host(hf_model_dir):
    tok = tokenizer.load_tokenizer(hf_model_dir("llama"))
    tb = _check_table(tok, 300)
    partial = [t for t in range(300) if "\ufffd" in tok.decode([t])]  # byte-level pieces of a character
    assert partial and all(tb.table[t, 0] >= 0x80 for t in partial)
    tok.cleanup = True  # " ." -> ".": the text depends on the neighbours
    assert stops.token_bytes(tok, 300) is None
    tok.cleanup = False


# --- whole runs on a tiny model ---------------------------------------------------------------------------

MAX_NEW, K = 24, 3
PROMPTS = ["the quick brown fox", "hello world, this", "speculative decoding over"]  # row 2: no stop strings


@functools.cache
def _engine(model_dir, draft):
    return engine.load(model_dir, draft=draft, kv=KVConfig("bf16"), dtype="float32", mesh=None)


@pytest.fixture(scope="module")
def tiny(hf_model_dir):
    """engine(drafter) on the tiny llama: "none", "ngram", or the model drafting for itself (every draft
    accepted: a stop lands inside a round's accepted run)."""
    path = hf_model_dir("llama")
    return lambda draft: _engine(path, path if draft == "self" else draft)


def _run(eng, max_new, stop, k):
    gen = GenerateConfig(MAX_NEW, lookahead=k, stop_at_eos=False)
    ids = [eng.encode(p) for p in PROMPTS]
    return eng.generate_ids(ids, [SamplingConfig()] * 3, max_new, gen, stop)


def _stop_in(eng, ids, n: int, lo: int, spanning: bool = False):
    """A stop string of n characters taken from the text of ids at character lo or after (its first
    occurrence; no U+FFFD, which the random model's byte pieces leave in its text), and the index of the token
    that completes it; spanning: one that no single token's text holds."""
    text = eng.text(ids)
    for start in range(lo, len(text) - n):
        stop = text[start : start + n]
        if "\ufffd" in stop or text.find(stop) != start:
            continue
        k = next(k for k in range(len(ids)) if stop in eng.text(ids[: k + 1]))
        if not (spanning and stop in eng.text(ids[k : k + 1])):
            return stop, k
    raise AssertionError(f"no stop string to take from {text!r}")


@pytest.mark.parametrize("draft", ["none", "ngram", "self"])
def test_text_is_the_plain_text_cut_and_the_row_stops_in_its_round(tiny, draft):
    """Per drafter: row 0's stop spans a token boundary; row 1 has two stop strings, the later one in its list
    completing first; row 2 has none. Text = the plain run's text cut before the first stop; token ids = the
    plain ids through the token that completes it; rounds = those of a run that ends on that token by
    max_new (the same rounds, the last one cut)."""
    eng, k = tiny(draft), 0 if draft == "none" else K
    plain = _run(eng, [MAX_NEW] * 3, None, k)
    assert all(st.finish_reason == "length" for _, st in plain)
    (ids0, _), (ids1, _), _ = plain
    stop0, k0 = _stop_in(eng, ids0, 3, 4, spanning=True)
    late, k_late = _stop_in(eng, ids1, 2, 12)
    early, k_early = _stop_in(eng, ids1, 2, 3)
    k1 = min(k_late, k_early)
    stop = [(stop0,), (late, early), ()]
    got = _run(eng, [MAX_NEW] * 3, stop, k)
    bounded = _run(eng, [k0 + 1, k1 + 1, MAX_NEW], None, k)
    for b, ((ids, st), (pids, _), (bids, bst)) in enumerate(zip(got, plain, bounded)):
        assert eng.text(ids, stop[b]) == stops.truncate(eng.text(pids), stop[b])[0], b
        assert ids == bids and st.rounds == bst.rounds, (b, len(ids), len(bids), st.rounds, bst.rounds)
        assert st.finish_reason == ("stop" if stop[b] else "length")
    assert got[0][0] == ids0[: k0 + 1] and got[1][0] == ids1[: k1 + 1]
    if draft == "self":  # every draft accepted: K + 1 tokens a round, a stop inside a round's run
        assert plain[0][1].accept_rate == 1.0
        assert any((i - 1) % (K + 1) != K for i in (k0, k1))


def test_finish_reason_eos_and_the_host_fallback(tiny):
    """EOS is "stop" too; and with a tokenizer whose decode is not concatenative (no byte table) the rows run
    on, and the host cuts the text and the token ids alike."""
    eng = tiny("none")
    [(ids, _)] = eng.generate_ids([eng.encode(PROMPTS[0])], [SamplingConfig()], [MAX_NEW],
                                  GenerateConfig(MAX_NEW, lookahead=0, stop_at_eos=False))
    eos = dataclasses.replace(eng, cfg=dataclasses.replace(eng.cfg, eos_token_ids=(ids[5],)))
    [r] = eos.generate([PROMPTS[0]], GenerateConfig(MAX_NEW, lookahead=0))
    assert r.token_ids == ids[: ids.index(ids[5]) + 1] and r.stats.finish_reason == "stop"

    stop, k = _stop_in(eng, ids, 3, 6)
    host = dataclasses.replace(eng, _token_bytes=[None], _compiled={})
    [r] = host.generate([PROMPTS[0]], GenerateConfig(MAX_NEW, lookahead=0, stop_at_eos=False, stop=(stop,)))
    assert r.text == stops.truncate(eng.text(ids), (stop,))[0] and r.token_ids == ids[: k + 1]
    assert r.stats.finish_reason == "stop" and r.stats.new_tokens == MAX_NEW  # ran on, cut on the host


def test_stream_holds_back_a_possible_stop_and_ends_before_it(tiny):
    eng = tiny("none")
    gen = GenerateConfig(MAX_NEW, lookahead=0, stop_at_eos=False)
    [r] = eng.generate([PROMPTS[1]], gen)
    stop, _ = _stop_in(eng, r.token_ids, 3, 5)
    pieces = list(eng.stream(PROMPTS[1], dataclasses.replace(gen, stop=(stop,))))
    assert "".join(pieces) == stops.truncate(r.text, (stop,))[0]


def test_stop_takes_a_string_or_a_list(tiny):
    """GenerateConfig's stop (so generate, stream and chat): one string is a 1-tuple, a list a tuple."""
    assert GenerateConfig(stop="\n\n").stop == ("\n\n",) and GenerateConfig(stop=["a", "b"]).stop == ("a", "b")
    eng = tiny("none")
    gen = GenerateConfig(MAX_NEW, lookahead=0, stop_at_eos=False)
    [r] = eng.generate([PROMPTS[1]], gen)
    stop, _ = _stop_in(eng, r.token_ids, 3, 5)
    want = stops.truncate(r.text, (stop,))[0]
    [as_str] = eng.generate([PROMPTS[1]], dataclasses.replace(gen, stop=stop))
    assert as_str.text == want and as_str.stats.finish_reason == "stop"
    assert "".join(eng.stream(PROMPTS[1], dataclasses.replace(gen, stop=[stop]))) == want


def test_first_stop_string_calls_from_several_threads_build_the_tables_once(monkeypatch):
    """Class 8: the Engine's thread contract (its docstring): threads making their first stop-string calls at once
    build the byte table once, and the engine keeps working (a second table appended by a race was read as the
    device arrays: TypeError)."""
    import threading
    import time

    built = []

    def slow(tok, vocab_size):
        built.append(1)
        time.sleep(0.05)
        return ("table",)

    monkeypatch.setattr(stops, "token_bytes", slow)
    eng = engine.Engine(cfg=types.SimpleNamespace(vocab_size=4), params=None, tokenizer=None, kv=None)
    threads = [threading.Thread(target=eng.token_bytes) for _ in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len(built) == 1 and eng._token_bytes == [("table",)]
