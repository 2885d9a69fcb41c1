"""The NLD backbone: config, PyTorch model, masks, checkpoint and tokenizer loading."""

from .backbone import NLDModel
from .checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from .config import NLDConfig, RopeConfig
from .tokenizer import Tokenizer

__all__ = ["Checkpoint", "NLDConfig", "NLDModel", "RopeConfig", "Tokenizer", "load_checkpoint", "save_checkpoint"]
