"""ONNX Runtime on the real model's shapes: SmolLM2-135M cut to its first layers, exported and served.

The whole model's export takes about 75 s on the 2-core CPU (tracing 30 layers), so the full
30-layer parity check lives in ``scripts/check_real_model_paths.py onnx`` (export, then ONNX Runtime
AR / linearspec / recguide == the native backend's AR). Here the same path runs on a checkpoint
made of the real model's first :data:`LAYERS` decoder layers with its real embedding, head, norm,
tokenizer and chat template: the real vocabulary (49 152-wide logits and the in-graph top-k over
them), GQA 9/3 heads, RoPE θ 1e5, bf16 weights widened to the float32 graph. It is exported the
way ``recguide export --out DIR`` does and loaded with ``LLM(..., backend="onnxruntime",
export_dir=DIR)``; every ONNX Runtime policy must equal the native backend's AR greedy output.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from recguide_trt import LLM, EngineConfig, SamplingParams  # noqa: E402
from tests.runtime.helpers import flat_cost_table  # noqa: E402

LAYERS = 2
MAX_TOKENS = 16
QUESTIONS = ["What is the capital of France?", "Write a haiku about autumn."]
CODE = ["def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
        "import os\n\n\ndef list_python_files(root):\n"]


def truncated_real_model(out: Path, layers: int = LAYERS) -> Path:
    """The real checkpoint with only its first ``layers`` decoder layers (same tensors, same files)."""
    from safetensors.torch import load_file, save_file

    from recguide_trt.models import resolve_model

    src = resolve_model("smollm2-135m")
    out.mkdir(parents=True, exist_ok=True)
    weights = load_file(str(src / "model.safetensors"))
    keep = {k: v for k, v in weights.items()
            if not (m := re.search(r"\.layers\.(\d+)\.", k)) or int(m.group(1)) < layers}
    save_file(keep, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["num_hidden_layers"] = layers
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (src / name).is_file():
            shutil.copyfile(src / name, out / name)
    return out


def engine_config() -> EngineConfig:
    return EngineConfig(max_num_seqs=4, max_model_len=512, max_block_size=8, cost_table=flat_cost_table())


@pytest.fixture(scope="module")
def real_cut(tmp_path_factory):
    """(checkpoint, export dir, native reference LLM, prompt ids, AR token ids)."""
    from recguide_trt.engine.export import export_onnx

    root = tmp_path_factory.mktemp("real-onnx")
    ckpt = truncated_real_model(root / "smollm2-cut")
    export = export_onnx(ckpt, root / "export")  # what `recguide export --model DIR --out DIR` writes
    native = LLM(ckpt, backend="native", engine_config=engine_config())
    prompts = [native.encode(native.chat_prompt([{"role": "user", "content": q}])) for q in QUESTIONS]
    prompts += [native.encode(c) for c in CODE]
    ar = [o.token_ids for o in native.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, policy="ar"))]
    return ckpt, export, native, prompts, ar


def test_export_has_the_real_shapes(real_cut):
    from recguide_trt.engine.manifest import ExportManifest

    _, export, native, _, _ = real_cut
    man = ExportManifest.load(export)
    assert (man.vocab_size, man.hidden_size, man.num_kv_heads, man.head_dim, man.num_layers) == (
        49152, 576, 3, 64, LAYERS)
    assert man.max_model_len == native.config.max_position_embeddings == 8192
    assert man.block_sizes == [2, 4, 8] and man.eos_token_id == native.config.eos_token_id


@pytest.fixture(scope="module")
def ort_llm(real_cut):
    """ONNX Runtime on the ready export (``export_dir``): used as it is, nothing exported into the cache."""
    ckpt, export, _, _, _ = real_cut
    llm = LLM(ckpt, backend="onnxruntime", export_dir=str(export), engine_config=engine_config())
    assert llm.backend.export_dir == Path(export)
    yield llm
    llm.shutdown()


@pytest.mark.parametrize("policy", ["ar", "linearspec", "recguide"])
def test_onnxruntime_equals_native_ar(real_cut, ort_llm, policy):
    _, _, _, prompts, ar = real_cut
    outs = ort_llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, policy=policy))
    for i, (o, ref) in enumerate(zip(outs, ar)):
        assert o.error is None, o.error
        assert o.token_ids == ref, f"{policy}, prompt {i}: onnxruntime {o.token_ids} != native AR {ref}"


def test_export_dir_of_another_model_is_refused(real_cut):
    _, export, _, _, _ = real_cut
    with pytest.raises(ValueError, match="export of another model"):
        LLM("tiny", backend="onnxruntime", export_dir=str(export), engine_config=engine_config())


def test_export_dir_too_short_for_the_engine_is_refused(real_cut, tmp_path):
    from recguide_trt.engine.manifest import ExportManifest

    ckpt, export, _, _, _ = real_cut
    short = tmp_path / "short"
    short.mkdir()
    man = ExportManifest.load(export)
    man.max_model_len = 256
    man.save(short)
    with pytest.raises(ValueError, match="exported for max_model_len 256"):
        LLM(ckpt, backend="onnxruntime", export_dir=str(short), engine_config=engine_config())
