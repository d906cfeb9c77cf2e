"""A model's chat template, rendered with jinja2 as transformers' apply_chat_template renders it (no
transformers import): a sandboxed environment with trim_blocks and lstrip_blocks, loop controls, and the
globals and filters transformers gives templates (raise_exception, strftime_now, a tojson that keeps
non-ASCII and HTML characters as they are, dict, namespace, the {% generation %} block).
"""

from __future__ import annotations

import datetime
import functools
import json
from pathlib import Path


def template_of(model_path) -> str | None:
    """The chat template of a model directory, where transformers looks for it: chat_template.jinja, then
    chat_template.json, then tokenizer_config.json's chat_template (a string, or a list of named templates,
    of which "default"); None if it has none."""
    path = Path(model_path)
    if (path / "chat_template.jinja").is_file():
        return (path / "chat_template.jinja").read_text(encoding="utf-8")
    for name in ("chat_template.json", "tokenizer_config.json"):
        try:
            template = json.loads((path / name).read_text(encoding="utf-8")).get("chat_template")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(template, list):
            template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"),
                            None)
        if isinstance(template, str):
            return template
    return None


def render(template: str, messages: list[dict], *, bos_token, eos_token, add_generation_prompt: bool = True) -> str:
    """messages rendered with template, as apply_chat_template(messages, tokenize=False, add_generation_prompt=...)
    renders them for a tokenizer with these special tokens. jinja2's TemplateError (raise_exception included)
    and SecurityError propagate."""
    return _compiled(template).render(messages=messages, tools=None, documents=None,
                                      add_generation_prompt=add_generation_prompt, bos_token=bos_token,
                                      eos_token=eos_token)


@functools.lru_cache(maxsize=8)
def _compiled(template: str):
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    class Namespace(jinja2.utils.Namespace):  # no underscore attributes: no way to CPython internals
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a chat template cannot set {name!r} on a namespace")

    class Generation(jinja2.ext.Extension):  # {% generation %}..{% endgeneration %}: its body, as it is
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, namespace=Namespace,
                       strftime_now=lambda fmt: datetime.datetime.now().strftime(fmt),
                       dict=lambda *a, **kw: dict(*a, **kw))
    return env.from_string(template)
