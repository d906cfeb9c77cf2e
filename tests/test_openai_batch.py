"""OpenAI batch JSONL through the real job runner (jspec/jobs/openai_batch.py): both endpoints answered in
OpenAI's shapes, each bad line its own error record, resume keyed by custom_id and fingerprint, and chat
templates rendered exactly as transformers renders them.
"""

from __future__ import annotations

import functools
import json
import shutil

import pytest

from jspec.jobs import batch
from jspec.runtime import engine
from jspec.jobs import openai_batch
from jspec.config import GenerateConfig, KVConfig, SamplingConfig
from jspec.io import chat

GEN = GenerateConfig(max_new_tokens=8, lookahead=0, stop_at_eos=False)
TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
            "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}\n"
            "<|{{ m['role'] }}|>\n{{ m['content'] | trim }}{{ eos_token }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": " hello wörld, € "},
            {"role": "assistant", "content": "the quick"}, {"role": "user", "content": [{"type": "text", "text": "fox"}]}]


@pytest.fixture(scope="module")
def model_dir(hf_model_dir, tmp_path_factory):
    """The tiny llama with a chat template in its tokenizer_config.json."""
    path = tmp_path_factory.mktemp("chat") / "llama"
    shutil.copytree(hf_model_dir("llama"), path)
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps(cfg | {"chat_template": TEMPLATE}))
    (path / "chat_template.jinja").unlink(missing_ok=True)
    return path


@pytest.fixture(scope="module")
def eng(model_dir):
    return engine.load(model_dir, draft=None, kv=KVConfig("bf16"), dtype="float32", mesh=None)


@functools.cache
def _hf(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def test_chat_template_renders_as_transformers(model_dir, eng):
    hf = _hf(model_dir)
    messages = openai_batch._messages(MESSAGES)  # text parts joined
    text = chat.render(chat.template_of(model_dir), messages, bos_token="<s>", eos_token="</s>")
    assert text == hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if not isinstance(ids, list) else ids
    assert openai_batch._prompt(openai_batch.CHAT, {"messages": MESSAGES}, eng) == list(ids)
    assert eng.chat_template == TEMPLATE


def _line(cid, url, **body) -> bytes:
    return json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body}, ensure_ascii=False).encode()


def _records(path) -> dict:
    recs = [json.loads(x) for x in path.read_bytes().splitlines() if x]
    return {r["custom_id"]: r for r in recs}, recs


LINES = [
    _line("c1", "/v1/completions", model="tiny", prompt="the quick brown", max_tokens=6),
    _line("chat1", "/v1/chat/completions", model="tiny", messages=MESSAGES, max_completion_tokens=5),
    _line("c2", "/v1/completions", prompt=[5, 6, 7, 8], stop=["zz", "\n\n"], temperature=0, n=1, stream=False),
    _line("bad-n", "/v1/completions", prompt="x", n=2),
    _line("bad-logprobs", "/v1/chat/completions", messages=MESSAGES, logprobs=True),
    _line("bad-tools", "/v1/chat/completions", messages=MESSAGES, tools=[]),
    _line("bad-url", "/v1/embeddings", input="x"),
    b'{"custom_id": "bad-json", "body": {',
    _line("c1", "/v1/completions", prompt="again"),
    _line("bad-stop", "/v1/completions", prompt="x", stop=[""]),
]


def _run(eng, src, dst, **kw):
    return batch.run_job(eng, src, dst, GEN, SamplingConfig(), batch_size=2, progress=False, **kw)


def test_both_endpoints_and_error_lines_round_trip(eng, tmp_path):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_bytes(b"\n".join(LINES) + b"\n")
    summary = _run(eng, src, dst)
    by_id, recs = _records(dst)
    assert len(recs) == len(LINES) and (summary.prompts, summary.errors) == (3, 7)
    assert all(list(r) == ["id", "custom_id", "response", "error"] and r["id"].startswith("batch_req_") for r in recs)
    errors = {r["custom_id"]: r["error"]["code"] for r in recs if r["error"]}
    assert errors == {"bad-n": "unsupported_value", "bad-logprobs": "unsupported_value",
                      "bad-tools": "unsupported_parameter", "bad-url": "invalid_url", None: "invalid_json",
                      "c1": "duplicate_custom_id", "bad-stop": "invalid_request"}
    assert all(r["response"] is None for r in recs if r["error"])

    c1 = by_id["c1"] if by_id["c1"]["error"] is None else next(r for r in recs if r["custom_id"] == "c1" and not r["error"])
    body = c1["response"]["body"]
    assert c1["response"]["status_code"] == 200 and body["object"] == "text_completion" and body["model"] == "tiny"
    [want] = eng.generate(["the quick brown"], GenerateConfig(6, lookahead=0, stop_at_eos=False))
    assert body["choices"][0]["text"] == want.text and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": len(eng.encode("the quick brown")), "completion_tokens": 6,
                             "total_tokens": len(eng.encode("the quick brown")) + 6}

    reply = by_id["chat1"]["response"]["body"]
    ids = openai_batch._prompt(openai_batch.CHAT, {"messages": MESSAGES}, eng)
    [(tokens, _)] = eng.generate_ids([ids], [SamplingConfig()], [5], GEN)
    assert reply["object"] == "chat.completion" and reply["choices"][0]["message"] == {
        "role": "assistant", "content": eng.text(tokens)}
    assert reply["usage"]["prompt_tokens"] == len(ids) and reply["usage"]["completion_tokens"] == 5

    c2 = by_id["c2"]["response"]["body"]["choices"][0]
    [(tokens, st)] = eng.generate_ids([[5, 6, 7, 8]], [SamplingConfig()], [8], GEN, [("zz", "\n\n")])
    assert c2["text"] == eng.text(tokens, ("zz", "\n\n")) and c2["finish_reason"] == st.finish_reason


def test_resume_is_keyed_by_custom_id_and_fingerprint(eng, tmp_path):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_bytes(b"\n".join(LINES) + b"\n")
    _run(eng, src, dst)
    full = dst.read_bytes().splitlines(keepends=True)
    dst.write_bytes(b"".join(full[:4]) + full[4][:10])  # killed mid-write: a torn record is cut on resume
    src.write_bytes(b"\n".join(reversed(LINES)) + b"\n")  # lines moved: still the same requests
    summary = _run(eng, src, dst)
    assert summary.skipped == 4
    _, recs = _records(dst)
    assert sorted(r["id"] for r in recs) == sorted(json.loads(x)["id"] for x in full)

    src.write_bytes(b"\n".join([_line("c1", "/v1/completions", prompt="changed")] + LINES[1:]) + b"\n")
    with pytest.raises(batch.JobError, match="the input has changed .*custom_id"):
        _run(eng, src, dst)
    jspec_out = tmp_path / "jspec.jsonl"
    jspec_out.write_bytes(json.dumps({"id": "a", "line": 1, "line_hash": "0", "text": "t"}).encode() + b"\n")
    with pytest.raises(batch.JobError, match="is not an OpenAI batch output file"):
        _run(eng, src, jspec_out)


def test_format_is_detected_by_the_first_valid_line():
    assert openai_batch.is_openai([(1, b"not json"), (2, LINES[0])])
    assert not openai_batch.is_openai([(1, b'{"id": 1, "prompt": "x"}'), (2, LINES[0])])


def _parsed(eng, **body):
    """(custom_id, Job fields or (code, message)) of one chat line with `body`."""
    return openai_batch.parse(_line("x", openai_batch.CHAT, messages=MESSAGES, **body), eng, GEN, SamplingConfig())


def test_openai_values_are_read_as_openai_reads_them(eng):
    """Classes 7 and 11: a null field is an absent one (max_completion_tokens null leaves max_tokens), a model that
    is not a string and a U+FFFD stop string are the line's error, not wrong results; OpenAI-valid seeds (any 64-bit
    integer), logit_bias and stream_options at their defaults are accepted."""
    _, job = _parsed(eng, max_tokens=2, max_completion_tokens=None)
    assert job["max_new"] == 2
    assert _parsed(eng, model=5)[1] == ("invalid_request", "model must be a string, got int")
    code, message = _parsed(eng, stop="\ufffd")[1]
    assert code == "invalid_request" and "U+FFFD" in message
    for seed, want in ((-5, 2**32 - 5), (2**40 + 3, 3), (7, 7)):
        assert _parsed(eng, seed=seed)[1]["sampling"].seed == want
    _, job = _parsed(eng, logit_bias=None, stream_options=None)
    assert isinstance(job, dict)
    assert _parsed(eng, logit_bias={"5": 1})[1][0] == "unsupported_value"


def test_a_template_that_fails_is_that_line_s_error(model_dir, tmp_path):
    """Class 3 in a job: a chat template that raises (here a ZeroDivisionError) answers each chat line with an error
    record; the completions lines still run."""
    bad = tmp_path / "bad"
    shutil.copytree(model_dir, bad)
    (bad / "chat_template.jinja").write_text("{{ 1 / 0 }}")
    eng = engine.load(bad, draft=None, kv=KVConfig("bf16"), dtype="float32", mesh=None)
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_bytes(_line("chat", openai_batch.CHAT, messages=MESSAGES) + b"\n" +
                    _line("plain", openai_batch.COMPLETIONS, prompt="the quick", max_tokens=2) + b"\n")
    _run(eng, src, dst)
    by_id, _ = _records(dst)
    assert "ZeroDivisionError" in by_id["chat"]["error"]["message"] and by_id["plain"]["error"] is None
