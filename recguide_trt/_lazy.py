"""PEP 562 lazy exports: a package names its public objects and imports each module on first use.

Why: ``recguide --help``, a bad command line, the engine and the model config must not wait for
``import torch`` (several seconds on the 2-core hosts), yet ``from recguide_trt import LLM`` keeps working."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, str], namespace: dict) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` for ``package``: ``exports`` maps a name to the relative module that defines it;
    a name, once loaded, is stored in the package's ``namespace`` so the next lookup is a plain attribute."""

    def __getattr__(name: str):
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted([*namespace, *exports])

    return __getattr__, __dir__
