"""A checkpoint's chat template (``tokenizer_config.json`` → ``chat_template``), rendered as Hugging Face does.

transformers renders chat templates with jinja2's immutable sandbox, ``trim_blocks`` and
``lstrip_blocks``, ``raise_exception`` and ``strftime_now`` globals (Llama 3's templates put today's date
in the system turn) and a ``tojson`` filter, passing ``messages``,
``add_generation_prompt`` and the special tokens of ``tokenizer_config.json`` (``bos_token``,
``eos_token``, ...); this module does the same so a served prompt matches what the model was tuned on.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from .config import read_json_object

CONFIG_FILE = "tokenizer_config.json"
SPECIAL_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token", "mask_token")
RESERVED_KWARGS = ("messages", "add_generation_prompt")
"""Template variables a caller's ``chat_template_kwargs`` may not set: the conversation and its generation prompt."""


def check_template_kwargs(kwargs) -> dict:
    """``chat_template_kwargs`` (vLLM's and transformers' name: extra template variables, e.g. Qwen3's
    ``enable_thinking``) checked: an object with string keys, none of :data:`RESERVED_KWARGS`. None → {}."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise ValueError(f"chat_template_kwargs must be an object of template variables, got "
                         f"{type(kwargs).__name__}")
    taken = [k for k in kwargs if k in RESERVED_KWARGS]
    if taken:
        raise ValueError(f"chat_template_kwargs may not set {taken[0]!r} (the request's own)")
    return dict(kwargs)


def _token_text(v) -> str | None:
    """A special token as tokenizer_config.json stores it: a string or an AddedToken dict."""
    if isinstance(v, dict):
        return v.get("content")
    return v if isinstance(v, str) else None


def load_chat_template(checkpoint_dir: str | Path) -> Callable[..., str] | None:
    """The checkpoint's chat template as ``render(messages, **template_kwargs) -> prompt text``, or None when it
    has none. ``template_kwargs`` (checked by :func:`check_template_kwargs`) are extra template variables; as in
    transformers, they may override the special tokens.

    A malformed tokenizer_config.json or template raises ``ValueError`` naming the file.
    """
    path = Path(checkpoint_dir) / CONFIG_FILE
    if not path.is_file():
        return None
    cfg = read_json_object(path, "tokenizer settings")
    template = cfg.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if template is None:
        return None
    if not isinstance(template, str):
        raise ValueError(f"{path}: 'chat_template' must be a string (or a list of named templates)")
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        compiled = env.from_string(template)
    except TemplateError as exc:
        raise ValueError(f"{path}: 'chat_template' is not a valid jinja2 template ({exc})") from None
    specials = {k: _token_text(cfg.get(k)) for k in SPECIAL_KEYS}

    def render(messages: list[dict], **template_kwargs) -> str:
        variables = {**specials, **check_template_kwargs(template_kwargs)}
        return compiled.render(messages=messages, add_generation_prompt=True, **variables)

    return render
