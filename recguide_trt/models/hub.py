"""``hf:ORG/NAME`` (or ``ORG/NAME``): a model on the Hugging Face hub, fetched with ``huggingface_hub``."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from .store import downloads_dir

log = logging.getLogger("recguide_trt")
PATTERNS = ["*.json", "*.safetensors", "*.jinja", "tokenizer*"]
"""What a conversion needs (not .bin, .gguf or ONNX copies that some repositories also hold)."""


def fetch(repo_id: str, revision: str | None = None) -> Path:
    """A local snapshot of ``repo_id`` (config, safetensors, tokenizer), fetched unless cached."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ImportError("importing from the Hugging Face hub needs huggingface_hub: "
                          "pip install 'recguide-trt[hub]'") from None
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    folder = downloads_dir() / "hub" / repo_id.replace("/", "--")
    log.info("fetching %s from the Hugging Face hub (%s) into %s", repo_id, endpoint, folder)
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=PATTERNS, local_dir=folder))
    except Exception as exc:  # offline, gated, missing: all arrive as different hub errors
        kind = type(exc).__name__
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ValueError(f"fetching {repo_id} from the Hugging Face hub failed ({kind}: {first[:300]}); tried "
                         f"{endpoint}/{repo_id}. If the hub is unreachable, download the model elsewhere and "
                         f"import its directory (recguide import DIR), or use a named model") from None
