"""RecGuide-TRT: diffusion-AR self-speculative decoding with Reciprocal Guidance."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_exports

# The public names are imported on first use (PEP 562): ``import recguide_trt.cli`` must not pay for torch,
# so that ``recguide --help`` and a bad command line answer at once.
_EXPORTS = {
    "LLM": ".api",
    "RequestOutput": ".api",
    "EngineConfig": ".runtime.engine",
    "SamplingParams": ".runtime.params",
    "RecGuideConfig": ".runtime.policies.recguide",
}

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from .api import LLM, RequestOutput
    from .runtime.engine import EngineConfig
    from .runtime.params import SamplingParams
    from .runtime.policies.recguide import RecGuideConfig

__all__ = ["LLM", "EngineConfig", "RecGuideConfig", "RequestOutput", "SamplingParams"]
__version__ = "0.1.0"


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
