"""RecGuide-TRT: diffusion-AR self-speculative decoding with Reciprocal Guidance."""

from .api import LLM, RequestOutput
from .runtime.engine import EngineConfig
from .runtime.params import SamplingParams
from .runtime.policies.recguide import RecGuideConfig

__all__ = ["LLM", "EngineConfig", "RecGuideConfig", "RequestOutput", "SamplingParams"]
__version__ = "0.1.0"
