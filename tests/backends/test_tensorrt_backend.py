"""TensorRT backend: CPU-side checks (GPU probe, engine lookup, lazy imports) + GPU/TensorRT parity tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from recguide_trt.backends import tensorrt_backend as tb
from recguide_trt.engine import build
from tests.conftest import has_tensorrt, random_model, tiny_config

HAS_GPU = tb.gpu_count() > 0
HAS_TRT = has_tensorrt()


def test_import_is_lazy():
    # torch may import cuda-python itself: compare with what `import recguide_trt` already loaded.
    code = ("import sys, recguide_trt; base = set(sys.modules); "
            "import recguide_trt.backends.tensorrt_backend, recguide_trt.engine.build, recguide_trt.runtime.streams; "
            "new = [m for m in set(sys.modules) - base if m.split('.')[0] in ('tensorrt', 'cuda')]; "
            "assert not new and 'tensorrt' not in sys.modules, new")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_gpu_probe_never_raises():
    n = tb.gpu_count()
    assert isinstance(n, int) and n >= 0


@pytest.mark.skipif(HAS_GPU, reason="a GPU is present")
def test_constructor_refuses_without_gpu(tmp_path):
    from recguide_trt.engine.manifest import ExportManifest, derive_profiles

    man = ExportManifest(config_fingerprint="x", weights_key="y", dtype="float32", num_layers=1, num_kv_heads=1,
                         head_dim=8, hidden_size=8, vocab_size=16, mask_token_id=3, eos_token_id=2,
                         max_model_len=64, block_sizes=[4], has_draft_adapter=False, topk=3, inputs=[], outputs=[],
                         profiles=derive_profiles([4], 64))
    man.save(tmp_path)
    (tmp_path / build.ENGINE_FILE).write_bytes(b"not an engine")
    with pytest.raises(RuntimeError, match="needs an NVIDIA GPU"):
        tb.TensorRTBackend(tmp_path, 2, 32)


def _fake_engine_dir(root: Path, name: str, fingerprint: str, wkey: str, precision: str = "fp16") -> Path:
    from recguide_trt.engine.manifest import ExportManifest, derive_profiles

    d = root / name
    d.mkdir(parents=True)
    ExportManifest(config_fingerprint=fingerprint, weights_key=wkey, dtype="float32", num_layers=1, num_kv_heads=1,
                   head_dim=8, hidden_size=8, vocab_size=16, mask_token_id=3, eos_token_id=2, max_model_len=64,
                   block_sizes=[4], has_draft_adapter=False, topk=3, inputs=[], outputs=[],
                   profiles=derive_profiles([4], 64)).save(d)
    (d / build.ENGINE_FILE).write_bytes(b"x")
    (d / build.ENGINE_INFO).write_text(json.dumps({"precision": precision}))
    return d


def test_find_engine_dir(tmp_path, random_ckpt, monkeypatch):
    from recguide_trt.engine.export import weights_key
    from recguide_trt.model.config import NLDConfig

    monkeypatch.delenv(tb.ENGINE_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "engines"
    root.mkdir()
    with pytest.raises(FileNotFoundError, match="build_engine.sh --model") as exc:
        tb.find_engine_dir(random_ckpt, engines_root=root)
    assert str(random_ckpt) in str(exc.value)
    with pytest.raises(FileNotFoundError, match="no TensorRT engine"):
        tb.TensorRTBackend.from_checkpoint(random_ckpt, 2, 64, engines_root=root)

    fp = NLDConfig.from_json(random_ckpt / "config.json").fingerprint()
    stale = _fake_engine_dir(root, "stale", fp, "other-weights")
    with pytest.raises(FileNotFoundError, match="other weight files"):
        tb.find_engine_dir(random_ckpt, engines_root=root)
    good = _fake_engine_dir(root, "good", fp, weights_key(random_ckpt))
    _fake_engine_dir(root, "unrelated", "fp-of-another-model", weights_key(random_ckpt))
    assert tb.find_engine_dir(random_ckpt, engines_root=root) == good
    assert tb.find_engine_dir(good) == good  # an engine dir is accepted as is
    with pytest.raises(FileNotFoundError):
        tb.find_engine_dir(random_ckpt, engines_root=root, precision="fp32")
    monkeypatch.setenv(tb.ENGINE_DIR_ENV, str(root))
    assert tb.find_engine_dir(random_ckpt) == good
    assert stale.is_dir()


def test_stream_handle_conversion():
    assert tb._handle(None) == 0 and tb._handle(7) == 7

    class S:
        def __int__(self):
            return 42

    assert tb._handle(S()) == 42


# ------------------------------------------------------------------------------------------------
# GPU + TensorRT: parity with the torch backend, launch/collect on two streams
# ------------------------------------------------------------------------------------------------
needs_trt_gpu = [pytest.mark.tensorrt, pytest.mark.gpu,
                 pytest.mark.skipif(not (HAS_GPU and HAS_TRT), reason="needs TensorRT and a CUDA GPU")]


@pytest.fixture(scope="module")
def trt_pair(tmp_path_factory):
    if not (HAS_GPU and HAS_TRT):
        pytest.skip("needs TensorRT and a CUDA GPU")
    lib = build.find_plugin_library(os.environ.get("RECGUIDE_PLUGIN_LIB"))
    if lib is None:
        pytest.skip("plugin library not built (plugins/build/librecguide_plugins.so or $RECGUIDE_PLUGIN_LIB)")
    from recguide_trt.backends.torch_backend import TorchBackend
    from recguide_trt.engine.export import export_onnx

    model = random_model(tiny_config())
    onnx_dir = export_onnx(model, tmp_path_factory.mktemp("onnx"), max_model_len=128, block_sizes=[2, 4])
    out = build.build_engine(onnx_dir, name="t", precision="fp32", plugin_lib=str(lib),
                             out_root=tmp_path_factory.mktemp("engines"), timing_cache="")
    trt_be = tb.TensorRTBackend(out, 4, 96)
    torch_be = TorchBackend(model, 4, 96)
    for c in torch_be.k_cache + torch_be.v_cache:
        c.zero_()
    yield trt_be, torch_be
    trt_be.close()


def _batches():
    from recguide_trt.backends.base import ForwardBatch
    from recguide_trt.model import masks

    def mk(slots, past, ids, intra, gate=0.0, write=True):
        ids = np.asarray(ids, np.int64)
        B, T = ids.shape
        pos = np.asarray(past)[:, None] + np.arange(T)[None]
        return ForwardBatch(np.asarray(slots, np.int64), np.asarray(past, np.int64), ids, pos,
                            np.broadcast_to(intra, (B, T, T)).copy(), np.full((B, T), gate, np.float32),
                            np.zeros(B, bool), write)

    rng = np.random.default_rng(0)
    yield mk([0, 1], [0, 0], rng.integers(4, 90, (2, 9)), masks.causal(9))            # prefill
    yield mk([0, 1], [9, 9], rng.integers(4, 90, (2, 4)), masks.causal(4))            # verify
    yield mk([1, 0], [13, 13], [[5, 3, 3, 3]] * 2, masks.draft_block(4), 1.0, False)  # draft
    yield mk([0], [13], rng.integers(4, 90, (1, 8)), masks.fused_rows(4, 2, 4))       # fused


@pytest.mark.tensorrt
@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_GPU and HAS_TRT), reason="needs TensorRT and a CUDA GPU")
def test_tensorrt_matches_torch(trt_pair):
    trt_be, torch_be = trt_pair
    for batch in _batches():
        a, b = trt_be.forward(batch), torch_be.forward(batch)
        np.testing.assert_array_equal(a.argmax, b.argmax)
        np.testing.assert_array_equal(a.top_ids, b.top_ids)
        np.testing.assert_allclose(a.top_probs, b.top_probs[..., :2], rtol=1e-3, atol=1e-4)  # the graph scores two


@pytest.mark.tensorrt
@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_GPU and HAS_TRT), reason="needs TensorRT and a CUDA GPU")
def test_tensorrt_split_plan_on_cuda_python_streams(trt_pair):
    from recguide_trt.runtime.streams import (
        CudaPythonStreamExecutor,
        SequentialExecutor,
        check_trace,
        split_overlap_plan,
    )

    trt_be, _ = trt_pair
    verify, draft = list(_batches())[1:3]
    plan = split_overlap_plan(verify, draft)
    ex = CudaPythonStreamExecutor()
    outs = ex.run(plan, trt_be)
    check_trace(plan, ex.trace)
    ref = SequentialExecutor().run(plan, trt_be)
    for name in ("verify", "prospective"):
        np.testing.assert_array_equal(outs[name].argmax, ref[name].argmax)
    ex.close()
