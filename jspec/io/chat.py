"""Chat templates: a model's jinja2 template rendered as transformers' apply_chat_template renders it.

transformers compiles a template in an ImmutableSandboxedEnvironment (trim_blocks, lstrip_blocks, the
loopcontrols extension and a `{% generation %}` tag) with its own `tojson` (no HTML escaping),
`raise_exception`, `strftime_now`, a `dict` without attribute tricks and a `namespace` that refuses
underscore names, then renders it with the messages, `tools=None`, `documents=None`,
`add_generation_prompt` and the tokenizer's named special tokens. This module does the same without
importing transformers; tests/test_chat.py compares the two.

The rendered text already holds the template's special tokens (a BOS among them where the template
writes one): transformers tokenizes it with add_special_tokens=False, and so does Engine.chat.
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
import time
from datetime import datetime
from pathlib import Path

from jspec.config import ConfigError


def render(template: str, messages: list[dict], *, bos_token: str | None, eos_token: str | None,
           add_generation_prompt: bool = True) -> str:
    """The chat `messages` ([{"role": str, "content": str}, ...]) as `template` renders them.

    bos_token / eos_token: the tokenizer's, or None where it has none (the template then sees them
    undefined, as with transformers). A bad message or a template that fails is a ConfigError."""
    if isinstance(template, Unreadable):
        raise ConfigError(template.why)
    if not isinstance(template, str):
        raise ConfigError(f"a chat template must be a str, got {type(template).__name__}")
    chat = check_messages(messages)
    named = {k: v for k, v in (("bos_token", bos_token), ("eos_token", eos_token)) if v is not None}
    try:
        with _deadline(MAX_RENDER_S):
            return _bounded(_compiled(template).generate(messages=chat, tools=None, documents=None,
                                                         add_generation_prompt=bool(add_generation_prompt), **named))
    except ConfigError:
        raise
    except RecursionError:
        raise ConfigError("chat template: it recurses too deeply") from None
    except Exception as e:  # noqa: BLE001  whatever a template raises (TypeError, ZeroDivisionError, the sandbox's
        # range limit, raise_exception) is that template's error, never the caller's crash
        raise ConfigError(f"chat template: {type(e).__name__}: {e}") from None


# A render's bounds: chat templates render in microseconds to a few ms, a prompt is far below these.
MAX_RENDER_S = 2.0
MAX_RENDER_CHARS = 1 << 22


class Unreadable:
    """A chat template file that cannot be read (not UTF-8): the model loads, and only a render says why."""

    def __init__(self, why: str):
        self.why = why


def _bounded(pieces) -> str:
    out, size = [], 0
    for piece in pieces:
        size += len(piece)
        if size > MAX_RENDER_CHARS:
            raise ConfigError(f"chat template: the rendered text passes {MAX_RENDER_CHARS} characters")
        out.append(piece)
    return "".join(out)


@contextlib.contextmanager
def _deadline(seconds: float):
    """Raises ConfigError in the template's own code once `seconds` have passed (a loop in the template can run for
    ever without producing output): a trace on the compiled template's frames only ("<template>")."""
    end = time.monotonic() + seconds

    def line(frame, event, arg):
        if time.monotonic() > end:
            raise ConfigError(f"chat template: rendering took more than {seconds:g}s")
        return line

    def call(frame, event, arg):
        return line if frame.f_code.co_filename == "<template>" else None

    previous = sys.gettrace()
    sys.settrace(call)
    try:
        yield
    finally:
        sys.settrace(previous)


def check_messages(messages) -> list[dict]:
    """A fresh copy of a list of {"role": str, "content": str} messages (keys set to None dropped, as
    transformers drops them); ConfigError names the first problem."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ConfigError("messages must be a non-empty list of {'role': str, 'content': str}")
    chat = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ConfigError(f"message {i} must be a dict with 'role' and 'content', got {type(m).__name__}")
        m = {k: v for k, v in m.items() if v is not None}
        for key in ("role", "content"):
            if not isinstance(m.get(key), str):
                raise ConfigError(f"message {i}: '{key}' must be a str, got {type(m.get(key)).__name__}")
        chat.append(_plain(m, f"message {i}"))
    return chat


def _plain(x, where: str):
    """x rebuilt from plain JSON types (what the sandboxed template may see); ConfigError otherwise."""
    if x is None or type(x) in (str, int, float, bool):
        return x
    if isinstance(x, dict) and all(isinstance(k, str) for k in x):
        return {k: _plain(v, where) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v, where) for v in x]
    raise ConfigError(f"{where}: a value of type {type(x).__name__} is not plain JSON")


@functools.lru_cache(maxsize=16)
def _compiled(template: str):
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_generation_tag(), "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise, strftime_now=_strftime_now, dict=_Dict(), namespace=_namespace())
    env.intercepted_binops = frozenset({"*", "**"})
    env.call_binop = _binop
    try:
        tree = env.parse(template)
    except jinja2.TemplateSyntaxError as e:
        raise ConfigError(f"chat template: line {e.lineno}: {e.message}") from None
    for node in tree.find_all((jinja2.nodes.Include, jinja2.nodes.Import, jinja2.nodes.FromImport,
                               jinja2.nodes.Extends)):
        tag = type(node).__name__.lower().replace("fromimport", "from ... import")
        raise ConfigError(f"chat template: line {node.lineno}: {{% {tag} %}} reads other templates, which a chat "
                          "template cannot")
    return env.from_string(tree)


def _binop(context, operator: str, left, right):
    """`*` and `**` with the size of their result bounded (a template bomb: "x" * 10**10)."""
    if operator == "**":
        if isinstance(right, (int, float)) and abs(right) > 1024:
            raise ConfigError(f"chat template: an exponent of {right} is too large")
        return left**right
    for seq, n in ((left, right), (right, left)):
        if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_RENDER_CHARS:
            raise ConfigError(f"chat template: a repeated value passes {MAX_RENDER_CHARS} items")
    return left * right


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # jinja's own tojson escapes <, >, & and ' for HTML; chat templates want the JSON as written
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message):
    import jinja2

    raise jinja2.TemplateError(message)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


class _Dict:
    """`dict(...)` in a template, with no class attributes to reach through."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


@functools.cache
def _namespace():
    """jinja's namespace, refusing underscore-prefixed names (a way towards CPython internals)."""
    import jinja2

    def check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a chat template cannot store {name!r} on a namespace")

    class Namespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):  # jinja's signature: `self` may be a keyword too
            self, attrs = args[0], dict(*args[1:], **kwargs)
            for name in attrs:
                check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

    return Namespace


@functools.cache
def _generation_tag():
    """`{% generation %}...{% endgeneration %}` (training templates mark the assistant's part): renders
    its body unchanged, as transformers does when it tracks no assistant mask."""
    import jinja2.ext
    import jinja2.nodes

    class Generation(jinja2.ext.Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    return Generation


# ------------------------------------------------------------------------------------------------


def template_of(model_path: str | Path) -> str | None:
    """The chat template of a model: a GGUF file's `tokenizer.chat_template`, or in a Hugging Face
    directory chat_template.jinja (which transformers prefers) else tokenizer_config.json's
    `chat_template` (the "default" one where it lists several). None when there is none."""
    from jspec.io.checkpoint import is_gguf

    path = Path(model_path)
    if is_gguf(path):
        from jspec.io import gguf

        return gguf.chat_template(path)
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        try:
            return jinja.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            return Unreadable(f"chat template {str(jinja)!r} is not UTF-8 (byte 0x{e.object[e.start]:02x} at byte "
                              f"{e.start + 1})")
    config = path / "tokenizer_config.json"
    try:
        template = json.loads(config.read_text(encoding="utf-8")).get("chat_template") if config.is_file() else None
    except (ValueError, AttributeError):  # not JSON, not an object: no template to read
        return None
    if isinstance(template, list):  # [{"name": ..., "template": ...}]
        template = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}.get("default")
    return template if isinstance(template, str) else None


def special_tokens(tokenizer) -> dict[str, str | None]:
    """{"bos_token": ..., "eos_token": ...} of a jspec Tokenizer (or a transformers one)."""
    named = getattr(tokenizer, "named", None)
    get = named.get if isinstance(named, dict) else lambda k: getattr(tokenizer, k, None)
    return {k: (None if get(k) is None else str(get(k))) for k in ("bos_token", "eos_token")}
