"""OpenAI's batch JSONL as a jspec job format (jspec.jobs.job_lines.Format): requests in, responses out.

Input lines: {"custom_id": str, "method": "POST", "url": "/v1/completions" or "/v1/chat/completions",
"body": {...}}. A completions body has "prompt" (a string or a list of token ids); a chat body has
"messages" (role and content, the content a string or a list of text parts), rendered with the model's chat
template (jspec.io.chat, the generation prompt added) and tokenized without added special tokens, as
transformers' apply_chat_template does. Supported body fields: model (echoed, a string), max_tokens or
max_completion_tokens, temperature, top_p, top_k, seed (any 64-bit integer, modulo 2**32), stop (a string or a
list), and n, stream, stream_options, logprobs, logit_bias, echo, presence_penalty, frequency_penalty, user at
their defaults; absent or null ones take the job's command-line values. Anything else is that line's error, in OpenAI's shape:
    {"id": "batch_req_...", "custom_id": ..., "response": null, "error": {"code": ..., "message": ...}}
A result: {"id", "custom_id", "response": {"status_code": 200, "request_id", "body": a text_completion or
chat.completion object}, "error": null}. A record's id is "batch_req_" and its line's fingerprint (then
"_2", "_3" for a second and third identical line of one custom_id): resume keys each line by custom_id and
fingerprint, so lines may move; a custom_id used again is an error line.
"""

from __future__ import annotations

import dataclasses
import json
import time

from jspec.jobs import job_lines
from jspec.config import ConfigError, GenerateConfig, SamplingConfig, check_stops
from jspec.io import chat

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
LINE_FIELDS = ("custom_id", "method", "url", "body")
SAMPLING = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "seed": "seed"}
# fields accepted at their defaults only (the values listed), or ignored (None)
DEFAULTS = {"n": (1, None), "stream": (False, None), "logprobs": (None, False, 0), "top_logprobs": (None, 0),
            "echo": (False, None), "presence_penalty": (0, 0.0, None), "frequency_penalty": (0, 0.0, None),
            "best_of": (1, None), "suffix": (None,), "user": None, "metadata": None, "store": None,
            "logit_bias": (None, {}), "stream_options": (None,)}
BODY_FIELDS = {COMPLETIONS: ("model", "prompt", "max_tokens", *SAMPLING, "stop"),
               CHAT: ("model", "messages", "max_tokens", "max_completion_tokens", *SAMPLING, "stop")}


def is_openai(lines: list[tuple[int, bytes]]) -> bool:
    """Whether the first line that is a JSON object has "custom_id" and "body"."""
    for _, raw in lines:
        rec, _ = job_lines.loads(raw)
        if isinstance(rec, dict):
            return "custom_id" in rec and "body" in rec
    return False


class LineError(ValueError):
    """One line's error: its OpenAI code and message."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def parse(raw: bytes, engine, gen: GenerateConfig, base: SamplingConfig):
    """-> (custom_id or None, Job fields or (code, message))."""
    rec, error = job_lines.loads(raw)
    if error:
        return None, ("invalid_json", error)
    cid, error = job_lines.line_id(rec.get("custom_id") if isinstance(rec, dict) else None, "custom_id")
    if error:
        return None, ("invalid_request", error)
    try:
        return cid, _request(rec, engine, gen, base)
    except LineError as e:
        return cid, (e.code, str(e))
    except ConfigError as e:
        return cid, ("invalid_request", str(e))


def _request(rec, engine, gen: GenerateConfig, base: SamplingConfig) -> dict:
    if not isinstance(rec, dict):
        raise LineError("invalid_request", "a line must be a JSON object")
    unknown = sorted(set(rec) - set(LINE_FIELDS))
    if unknown:
        raise LineError("invalid_request", f"unknown field {unknown[0]!r} (a line has {', '.join(LINE_FIELDS)})")
    if not isinstance(rec.get("custom_id"), str) or not rec["custom_id"]:
        raise LineError("invalid_request", "custom_id must be a non-empty string")
    if rec.get("method", "POST") != "POST":
        raise LineError("invalid_request", f"method must be POST, got {rec['method']!r}")
    url, body = rec.get("url"), rec.get("body")
    if url not in BODY_FIELDS:
        raise LineError("invalid_url", f"url must be {COMPLETIONS} or {CHAT}, got {url!r}")
    if not isinstance(body, dict):
        raise LineError("invalid_request", "body must be a JSON object")
    _check_body(url, body)
    ids = _prompt(url, body, engine)
    given = [body[k] for k in ("max_completion_tokens", "max_tokens") if body.get(k) is not None]
    max_new = given[0] if given else gen.max_new_tokens  # a null field is an absent one, as OpenAI reads it
    overrides = {SAMPLING[k]: v for k, v in body.items() if k in SAMPLING and v is not None}
    for k, v in overrides.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (k in ("top_k", "seed") and not isinstance(v, int)):
            raise LineError("invalid_request", f"{k} has the wrong type ({type(v).__name__})")
    if "seed" in overrides:  # OpenAI's seed is any 64-bit integer; jspec's a 32-bit one: the same seed, the same draw
        if not -2**63 <= overrides["seed"] < 2**64:
            raise LineError("invalid_request", f"seed must be a 64-bit integer, got {overrides['seed']}")
        overrides["seed"] %= 2**32
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise LineError("invalid_request", f"model must be a string, got {type(model).__name__}")
    sampling = dataclasses.replace(base, **overrides)
    stop = job_lines.stop_strings(body["stop"]) if "stop" in body else gen.stop
    check_stops(stop)
    sampling.validate()
    engine.check(dataclasses.replace(gen, max_new_tokens=max_new), [len(ids)])
    return dict(ids=ids, max_new=max_new, sampling=sampling, stop=stop,
                meta=dict(url=url, model=model or "jspec"))


def _check_body(url: str, body: dict) -> None:
    for k, v in body.items():
        if k in BODY_FIELDS[url]:
            continue
        if k not in DEFAULTS:
            raise LineError("unsupported_parameter", f"unsupported parameter {k!r} for {url}")
        if DEFAULTS[k] is not None and not any(v is a or (type(v) is type(a) and v == a) for a in DEFAULTS[k]):
            raise LineError("unsupported_value", f"{k} = {json.dumps(v)} is not supported (only "
                                                 f"{json.dumps(DEFAULTS[k][0])})")
    if url == COMPLETIONS and "prompt" not in body or url == CHAT and "messages" not in body:
        raise LineError("invalid_request", f"missing {'prompt' if url == COMPLETIONS else 'messages'}")
    for k in ("max_tokens", "max_completion_tokens"):
        if k in body and body[k] is not None and (isinstance(body[k], bool) or not isinstance(body[k], int)):
            raise LineError("invalid_request", f"{k} must be an integer")


def _prompt(url: str, body: dict, engine) -> list[int]:
    if url == COMPLETIONS:
        prompt = body["prompt"]
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            raise LineError("unsupported_value", "one prompt per line: give each prompt its own custom_id")
        return engine.prompt_ids(prompt)
    if engine.chat_template is None:
        raise LineError("invalid_request", "the model has no chat template (tokenizer_config.json's chat_template "
                                           "or chat_template.jinja): use /v1/completions")
    text = chat.render(engine.chat_template, _messages(body["messages"]), **chat.special_tokens(engine.tokenizer))
    return engine.prompt_ids(engine.encode(text, add_special_tokens=False))  # the template wrote the special tokens


def _messages(messages) -> list[dict]:
    """messages, each with a string content (a list of text parts joined, as OpenAI reads it)."""
    if not isinstance(messages, list) or not messages:
        raise LineError("invalid_request", "messages must be a non-empty list")
    out = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise LineError("invalid_request", "each message must be an object with a role")
        content = m.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise LineError("unsupported_value", "only text content parts are supported")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise LineError("invalid_request", "a message's content must be a string or a list of text parts")
        out.append({**m, "content": content})
    return out


def keys(lines: list[tuple[int, bytes]]) -> dict:
    """{line number: (custom_id, fingerprint, k)}: the k-th line with this custom_id and these bytes."""
    seen, out = {}, {}
    for n, raw in lines:
        rec, _ = job_lines.loads(raw)
        cid = rec.get("custom_id") if isinstance(rec, dict) else None
        key = (job_lines.resume_key(cid), job_lines.fingerprint(raw))
        seen[key] = seen.get(key, 0) + 1
        out[n] = (*key, seen[key])
    return out


def _record_id(job) -> str:
    _, h, k = job.key
    return f"batch_req_{h}" + (f"_{k}" if k > 1 else "")


def record(engine, job, tokens, stats) -> dict:
    text = engine.text(tokens, job.stop, stats.healed)
    choice = {"index": 0, "logprobs": None, "finish_reason": stats.finish_reason}
    if job.meta["url"] == CHAT:
        obj, choice = "chat.completion", {**choice, "message": {"role": "assistant", "content": text}}
    else:
        obj, choice = "text_completion", {**choice, "text": text}
    rid = _record_id(job)
    body = {"id": rid.replace("batch_req_", "chatcmpl-" if obj == "chat.completion" else "cmpl-"), "object": obj,
            "created": int(time.time()), "model": job.meta["model"], "choices": [choice],
            "usage": {"prompt_tokens": len(job.ids), "completion_tokens": len(tokens),
                      "total_tokens": len(job.ids) + len(tokens)}}
    return {"id": rid, "custom_id": job.id,
            "response": {"status_code": 200, "request_id": rid.replace("batch_req_", "req_"), "body": body},
            "error": None}


def error(job, message) -> dict:
    code, message = message if isinstance(message, tuple) else (
        "duplicate_custom_id" if message.startswith("duplicate") else "invalid_request", message)
    return {"id": _record_id(job), "custom_id": job.id, "response": None,
            "error": {"code": code, "message": message}}


def answered(rec: dict):
    """(resume key, fingerprint) of a record this format writes, else None."""
    rid = rec.get("id")
    if not (isinstance(rid, str) and rid.startswith("batch_req_") and "custom_id" in rec and "error" in rec
            and "response" in rec):
        return None
    h, _, k = rid.removeprefix("batch_req_").partition("_")
    return (job_lines.resume_key(rec["custom_id"]), h, int(k) if k.isdigit() else 1), h


FORMAT = job_lines.Format("an OpenAI batch output file written by jspec", "custom_id", parse, keys, record, error,
                      answered, lambda key: f"the line of custom_id {key[0]}")
