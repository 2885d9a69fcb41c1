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


def _token_text(v) -> str | None:
    """A special token as tokenizer_config.json stores it: a string or an AddedToken dict."""
    if isinstance(v, dict):
        return v.get("content")
    return v if isinstance(v, str) else None


def load_chat_template(checkpoint_dir: str | Path) -> Callable[[list[dict]], str] | None:
    """The checkpoint's chat template as ``render(messages) -> prompt text``, or None when it has none.

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

    def render(messages: list[dict]) -> str:
        return compiled.render(messages=messages, add_generation_prompt=True, **specials)

    return render
