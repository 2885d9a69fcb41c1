"""Shared fixtures: tiny random checkpoints in the real NLD layout."""

from __future__ import annotations

import fcntl
import importlib.util
import os
from pathlib import Path

import pytest
import torch

from recguide_trt.model import NLDConfig, NLDModel, RopeConfig, save_checkpoint

EMBEDDED = Path(__file__).resolve().parents[1] / "recguide_trt" / "assets" / "nld-tiny"


def tiny_config(**overrides) -> NLDConfig:
    base = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, max_position_embeddings=512, mask_token_id=3, eos_token_id=2,
                block_size=4)
    base.update(overrides)
    return NLDConfig(**base)


def random_model(cfg: NLDConfig, seed: int = 0, std: float = 0.3) -> NLDModel:
    """Random weights with a large enough scale that argmax margins are rarely near ties."""
    torch.manual_seed(seed)
    m = NLDModel(cfg)
    m.init_weights(seed, std=std)
    return m.eval()


def _random_ckpt(tmp_path_factory, name: str, **overrides) -> Path:
    cfg = tiny_config(hidden_size=48, head_dim=16,
                      rope=RopeConfig(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                      original_max_position_embeddings=64, llama_4_scaling_beta=0.1), **overrides)
    path = tmp_path_factory.mktemp("ckpt") / name
    save_checkpoint(random_model(cfg), path)
    return path


@pytest.fixture(scope="session")
def random_ckpt(tmp_path_factory) -> Path:
    """A random checkpoint (no tokenizer) with query width != hidden size and YaRN + llama-4 scaling."""
    return _random_ckpt(tmp_path_factory, "random-nld")


@pytest.fixture(scope="session")
def random_ckpt_seed_causal(tmp_path_factory) -> Path:
    """The same random checkpoint with the causal-seed draft convention (``draft_seed_causal``)."""
    return _random_ckpt(tmp_path_factory, "random-nld-seed-causal", draft_seed_causal=True)


def has_embedded() -> bool:
    return (EMBEDDED / "config.json").is_file()


@pytest.fixture(scope="session")
def embedded_onnx_cache(tmp_path_factory) -> Path:
    """An export cache holding the embedded model's default ONNX export (``ensure_export``), made once per
    session: the export takes ~50 s on 2 cores, and tests/engine/test_export.py and
    tests/backends/test_onnxruntime_backend.py both need it. Read-only for its users."""
    if not has_embedded():
        pytest.skip("embedded checkpoint recguide_trt/assets/nld-tiny not present")
    pytest.importorskip("onnxscript")
    from recguide_trt.engine.export import ensure_export

    # Under xdist (run_tests.sh) the workers share one export: a folder beside their temp roots, made by
    # whichever worker comes first while the other waits on the lock.
    root = tmp_path_factory.getbasetemp()
    shared = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    cache = shared / "onnx-embedded"
    cache.mkdir(exist_ok=True)
    with open(shared / "onnx-embedded.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ensure_export(EMBEDDED, cache)
    return cache


def has_tensorrt() -> bool:
    """TensorRT importable (it never is in this workplace; the tensorrt-marked tests skip)."""
    from recguide_trt.engine import build

    try:
        build.import_tensorrt()
        return True
    except build.TensorRTMissing:
        return False


def load_script(path: Path, name: str):
    """A script of ``scripts/`` imported as a module (scripts are not part of the package)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
