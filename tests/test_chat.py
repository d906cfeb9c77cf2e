"""Chat templates: jspec.io.chat.render against transformers' apply_chat_template, template_of, Engine.chat."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("jinja2")

from jspec.config import ConfigError  # noqa: E402
from jspec.io import chat  # noqa: E402

# A template that uses what transformers adds to jinja: tojson without HTML escaping, namespace, loop
# controls, raise_exception, the generation tag, the special tokens and trim/lstrip of blocks.
TINY = """{{ bos_token }}
{%- set ns = namespace(n=0) -%}
{% for m in messages %}
  {% if m.role not in ['system', 'user', 'assistant'] %}{{ raise_exception('bad role ' + m.role) }}{% endif %}
  {% set ns.n = ns.n + 1 %}
  {% if m.content == 'skip' %}{% continue %}{% endif %}
<|{{ m.role }}|>{{ m.content | tojson }}
  {% if m.role == 'assistant' %}{% generation %}{{ eos_token }}{% endgeneration %}{% endif %}
{% endfor %}
{% if add_generation_prompt %}<|assistant|>({{ ns.n }}){% endif %}"""
MESSAGES = [{"role": "system", "content": "Be <brief> & \"exact\"."}, {"role": "user", "content": "Héllo 🙂"},
            {"role": "assistant", "content": "skip"}, {"role": "user", "content": "2 < 3?", "name": None}]


def _hf_render(template, messages, bos, eos, tokenizer=None):
    """transformers' apply_chat_template(tokenize=False, add_generation_prompt=True) of `template`."""
    pytest.importorskip("torch")
    if tokenizer is None:
        from transformers import PreTrainedTokenizerFast
        from tokenizers import Tokenizer
        from tokenizers.models import WordLevel

        tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"<s>": 0, "</s>": 1, "x": 2})),
                                            bos_token=bos, eos_token=eos)
    return tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                         add_generation_prompt=True)


def test_a_tiny_template_renders_as_transformers_renders_it():
    got = chat.render(TINY, MESSAGES, bos_token="<s>", eos_token="</s>")
    assert got == _hf_render(TINY, MESSAGES, "<s>", "</s>")
    assert '"Be <brief> & \\"exact\\"."' in got and "Héllo 🙂" in got and got.endswith("<|assistant|>(4)")


def test_without_a_generation_prompt_the_assistant_header_is_left_out():
    got = chat.render(TINY, MESSAGES[:2], bos_token="<s>", eos_token="</s>", add_generation_prompt=False)
    assert got.startswith("<s>") and "<|assistant|>" not in got


def test_a_missing_special_token_renders_empty_not_none():
    assert not chat.render("{{ bos_token }}{{ messages[0].content }}", MESSAGES[1:2], bos_token=None,
                           eos_token=None).startswith("None")


@pytest.mark.parametrize("messages,problem", [
    ([], "non-empty list"), ("hi", "non-empty list"), ([{"role": "user"}], "'content' must be a str"),
    ([{"role": 1, "content": "x"}], "'role' must be a str"), (["hi"], "must be a dict"),
    ([{"role": "user", "content": "x", "extra": object()}], "not plain JSON"),
])
def test_bad_messages_are_a_config_error_naming_the_problem(messages, problem):
    with pytest.raises(ConfigError, match=problem):
        chat.render(TINY, messages, bos_token=None, eos_token=None)


def test_raise_exception_and_syntax_errors_are_config_errors():
    with pytest.raises(ConfigError, match="bad role tool"):
        chat.render(TINY, [{"role": "tool", "content": "x"}], bos_token=None, eos_token=None)
    with pytest.raises(ConfigError, match="chat template"):
        chat.render("{% for %}", MESSAGES, bos_token=None, eos_token=None)


def test_the_sandbox_refuses_reaching_into_python():
    with pytest.raises(ConfigError):
        chat.render("{{ messages.__class__.__mro__ }}{% set ns = namespace() %}{% set ns._x = 1 %}", MESSAGES,
                    bos_token=None, eos_token=None)


def test_template_of_reads_the_jinja_file_before_tokenizer_config(tmp_path):
    assert chat.template_of(tmp_path) is None
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "A"}))
    assert chat.template_of(tmp_path) == "A"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}))
    assert chat.template_of(tmp_path) == "D"
    (tmp_path / "chat_template.jinja").write_text("J")
    assert chat.template_of(tmp_path) == "J"


# ------------------------------------------------------------------------------------------------
# SmolLM2's template, from its GGUF


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from test_gguf import smollm2

    from jspec.io import gguf as gguf_io

    path = smollm2()
    reader = gguf_io.open_gguf(path)
    return path, gguf_io.load_tokenizer(reader, gguf_io.model_config(reader))


def test_smollm2_template_renders_and_tokenizes_as_transformers(smollm2_tokenizer):
    pytest.importorskip("torch")
    from transformers import AutoTokenizer

    path, tok = smollm2_tokenizer
    ref = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    assert chat.template_of(path) == tok.chat_template == ref.chat_template
    for messages in (MESSAGES[1:2], MESSAGES):
        text = chat.render(tok.chat_template, messages, **chat.special_tokens(tok))
        assert text == ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = ref.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)
        assert tok.encode(text, add_special_tokens=False) == list(ids)


def test_a_model_without_a_template_is_an_error_line_under_chat(tmp_path, capsys):
    from test_gguf import tiny_model

    from jspec.cli import generate

    path = tiny_model(tmp_path, "llama")
    args = ["--model", str(path), "--draft", "none", "--kv", "bf16", "--compile-cache", "", "--chat", "hi"]
    assert generate.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: --chat: the model has no chat template")


def test_engine_chat_generates_from_the_rendered_template_without_a_second_bos(tmp_path):
    import jspec
    from jspec.config import GenerateConfig, KVConfig
    from test_gguf import tiny_model

    template = "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}"
    eng = jspec.load(tiny_model(tmp_path, "llama", template=template), draft="none", kv=KVConfig("bf16"),
                     dtype="float32", mesh=None)
    gen = GenerateConfig(max_new_tokens=4, lookahead=0, stop_at_eos=False)
    got = eng.chat([{"role": "user", "content": "hello"}], gen)
    ids = eng.tokenizer.encode(got.prompt, add_special_tokens=False)
    assert got.prompt == "<|im_start|><|im_start|>hello<|im_end|>" and ids.count(eng.tokenizer.bos_token_id) == 2
    assert eng.tokenizer.encode(got.prompt) == [eng.tokenizer.bos_token_id] + ids  # what chat() avoids
    assert got.token_ids == eng.generate([ids], gen)[0].token_ids


@pytest.mark.parametrize("template,problem", [
    ("{{ 1 / 0 }}", "ZeroDivisionError"), ("{{ messages + 1 }}", "TypeError"),
    ("{{ 'x' | int(base=99) }}{{ raise_exception(none) }}", "chat template"),
    ("{{ range(10**9) | list }}", "Range too big"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "recurses too deeply"),
    ("{% include 'other.jinja' %}", "{% include %} reads other templates"),
    ("{% from 'm' import x %}", "reads other templates"),
    ("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}", "took more than"),
    ("{{ 'x' * 10**10 }}", "repeated value"), ("{{ 2 ** 99999999 }}", "exponent"),
    ("{% for i in range(99999) %}{{ 'y' * 1000 }}{% endfor %}", "rendered text passes"),
])
def test_any_failing_or_unbounded_template_is_one_config_error_in_bounded_time(template, problem):
    """Class 3: whatever a template raises, a template that reads other templates, and a template bomb (a loop or a
    string without end) are one ConfigError, within the render's time bound (chat.MAX_RENDER_S)."""
    import time

    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=re.escape(problem)):
        chat.render(template, MESSAGES, bos_token="<s>", eos_token="</s>")
    assert time.monotonic() - t0 < chat.MAX_RENDER_S + 1


def test_a_template_file_that_is_not_utf8_is_named_and_blocks_only_a_render(tmp_path):
    """Class 10: an undecodable chat_template.jinja does not stop the model from loading; a render says which file
    and which byte."""
    (tmp_path / "chat_template.jinja").write_bytes(b"{{ bos_token }}\xff")
    template = chat.template_of(tmp_path)
    with pytest.raises(ConfigError, match=r"chat_template.jinja' is not UTF-8 \(byte 0xff at byte 16\)"):
        chat.render(template, MESSAGES, bos_token="<s>", eos_token="</s>")
