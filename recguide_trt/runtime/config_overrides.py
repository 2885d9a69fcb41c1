"""``FIELD=VALUE`` overrides of a config dataclass, from the command line (``recguide bench --recguide ...``).

A value is read by the field's annotation: ``int``, ``float``, ``bool`` (true/false, yes/no, on/off, 1/0), ``str``,
a tuple of ints (``2,4,8``), and ``none`` where the field may be None. The config's own checks (``RecGuideConfig.check``)
judge the value; this module only turns text into the field's type, or says which field it could not.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar

C = TypeVar("C")

_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def apply_overrides(config: C, items: list[str] | None, flag: str) -> C:
    """A copy of the dataclass ``config`` with each ``FIELD=VALUE`` of ``items`` set (later items win).

    Raises ``ValueError`` naming ``flag`` and the field for an item without ``=``, an unknown field, or a value
    that is not of the field's type."""
    if not items:
        return config
    hints = typing.get_type_hints(type(config))
    fields = [f.name for f in dataclasses.fields(config)]
    changes: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or not name:
            raise ValueError(f"{flag}: expected FIELD=VALUE, got {item!r}")
        if name not in fields:
            raise ValueError(f"{flag}: unknown field {name!r}; fields: {', '.join(fields)}")
        try:
            changes[name] = _parse(text.strip(), hints[name])
        except ValueError as exc:
            raise ValueError(f"{flag} {name}: {exc}, got {text!r}") from None
    return dataclasses.replace(config, **changes)


def recguide_config(items: list[str] | None, flag: str = "--recguide"):
    """The RecGuide policy's config with ``FIELD=VALUE`` overrides, its values checked as the policy checks them (a
    ``ValueError`` before any model loads; ``candidate_blocks`` against the largest block an engine allows, 32)."""
    from .policies.recguide import RecGuideConfig

    config = apply_overrides(RecGuideConfig(), items, flag)
    config.check(max_block=32)
    return config


def engine_config_with_recguide(max_num_seqs: int, items: list[str] | None, flag: str = "--recguide"):
    """The engine config a server builds its ``LLM`` with where RecGuide's config is overridden (``recguide serve
    --recguide``, a Ray replica, a Triton instance): ``max_num_seqs`` sequences and :func:`recguide_config`'s
    config; None without overrides (the ``LLM`` builds its own)."""
    if not items:
        return None
    from .engine import EngineConfig

    return EngineConfig(max_num_seqs=max_num_seqs, recguide=recguide_config(items, flag))


def _parse(text: str, kind: Any) -> Any:
    """``text`` as a value of the annotation ``kind``."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        if type(None) in args and text.lower() == "none":
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1:
            raise ValueError(f"cannot read a value of {kind}")
        try:
            return _parse(text, inner[0])
        except ValueError as exc:
            raise ValueError(f"{exc} or none") from None
    if kind is bool:
        low = text.lower()
        if low in _TRUE or low in _FALSE:
            return low in _TRUE
        raise ValueError("expected true or false")
    if kind is int:
        try:
            return int(text)
        except ValueError:
            raise ValueError("expected an integer") from None
    if kind is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError("expected a number") from None
    if kind is str:
        return text
    if typing.get_origin(kind) is tuple and args and all(a in (int, Ellipsis) for a in args):
        try:
            values = tuple(int(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise ValueError("expected integers separated by commas") from None
        if Ellipsis not in args and len(values) != len(args):
            raise ValueError(f"expected {len(args)} integers separated by commas")
        return values
    raise ValueError(f"cannot read a value of {kind}")
