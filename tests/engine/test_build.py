"""Engine build without TensorRT: CLI behaviour, plugin rewrite of the mismatch node, profile shapes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxscript")

from recguide_trt.engine import build  # noqa: E402
from recguide_trt.engine.manifest import ExportManifest  # noqa: E402
from tests.conftest import has_tensorrt, random_model, tiny_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory) -> Path:
    from recguide_trt.engine.export import export_onnx

    out = tmp_path_factory.mktemp("onnx")
    return export_onnx(random_model(tiny_config()), out, max_model_len=256, block_sizes=[2, 4])


# ------------------------------------------------------------------------------------------------
# CLI without TensorRT
# ------------------------------------------------------------------------------------------------
@pytest.mark.skipif(has_tensorrt(), reason="TensorRT is installed")
def test_main_without_tensorrt_prints_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "recguide_trt.engine.build", "--onnx-dir", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert "pip install" in lines[0] and "Traceback" not in proc.stderr


@pytest.mark.skipif(has_tensorrt(), reason="TensorRT is installed")
def test_main_function_returns_nonzero(capsys, tmp_path):
    assert build.main(["--onnx-dir", str(tmp_path)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install" in err[0]


def test_build_engine_sh_help():
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(ROOT / "build" / "build_engine.sh"), "--help"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "--onnx-dir" in proc.stdout and "--model" in proc.stdout and "--precision" in proc.stdout


def test_build_engine_sh_rejects_bad_model(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(ROOT / "build" / "build_engine.sh"), "--model", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode != 0 and "config.json" in proc.stderr


def test_default_config_is_valid():
    cfg = build.load_build_config()
    raw = json.loads((ROOT / "build" / "configs" / "default.json").read_text())
    assert cfg["precision"] == raw["precision"] and cfg["precision"] in build.PRECISIONS
    assert set(raw) - {"comment"} <= set(build.BUILTIN_DEFAULTS)


def test_config_rejects_unknown_keys(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"precisoin": "fp16"}))
    with pytest.raises(ValueError, match="unknown build setting"):
        build.load_build_config(p)


def test_engines_dir_is_ignored():
    proc = subprocess.run(["git", "check-ignore", "-q", "build/engines/x/model.engine"], cwd=ROOT)
    assert proc.returncode == 0


# ------------------------------------------------------------------------------------------------
# rewrite_mismatch_for_plugin
# ------------------------------------------------------------------------------------------------
def test_rewrite_for_plugin(export_dir, tmp_path):
    man = ExportManifest.load(export_dir)
    model = onnx.load(str(export_dir / man.onnx_file), load_external_data=False)
    before = onnx.ModelProto()
    before.CopyFrom(model)
    out = build.rewrite_mismatch_for_plugin(model, man, tau=0.375)
    assert model == before  # input not modified

    # valid ONNX (checked by path so that the external weights resolve)
    path = export_dir / "rewritten.onnx"
    onnx.save(out, str(path))
    onnx.checker.check_model(str(path))

    plugin = [n for n in out.graph.node if n.op_type == build.PLUGIN_NAME]
    assert len(plugin) == 1
    node = plugin[0]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert node.domain == build.PLUGIN_NAMESPACE
    assert attrs["plugin_namespace"] == b"recguide" and attrs["plugin_version"] == b"1"
    assert attrs["mask_token_id"] == man.mask_token_id and attrs["eos_token_id"] == man.eos_token_id
    assert attrs["tau"] == pytest.approx(0.375)
    types = {a.name: a.type for a in node.attribute}
    assert types["mask_token_id"] == onnx.AttributeProto.INT and types["tau"] == onnx.AttributeProto.FLOAT
    assert set(attrs) == {*build.PLUGIN_ATTRIBUTES, "plugin_namespace", "plugin_version"}
    assert node.input[0] == "logits" and len(node.input) == 2 and len(node.output) == 4
    assert node.output[1] == "top_probs"  # float32 output keeps its name
    # function body gone, tau input gone, graph outputs unchanged
    assert not any(f.name == build.PLUGIN_NAME for f in out.functions)
    assert "mismatch_tau" not in [i.name for i in out.graph.input]
    assert [o.name for o in out.graph.output] == [o.name for o in model.graph.output]
    producers = {o: n for n in out.graph.node for o in n.output}
    for name in ("top_ids", "flag_pos", "correction"):
        cast = producers[name]
        assert cast.op_type == "Cast" and cast.input[0] in node.output
        assert onnx.helper.get_attribute_value(cast.attribute[0]) == onnx.TensorProto.INT64
    # topologically sorted: every node input is produced earlier (or is a graph input/initializer)
    known = {i.name for i in out.graph.input} | {i.name for i in out.graph.initializer} | {""}
    for n in out.graph.node:
        assert all(i in known for i in n.input), n.name
        known.update(n.output)


def test_rewrite_lengths_subgraph_runs(export_dir):
    """The Shape/Expand/Cast part computes lengths = T for every row (int32), checked with ORT."""
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    man = ExportManifest.load(export_dir)
    out = build.rewrite_mismatch_for_plugin(onnx.load(str(export_dir / man.onnx_file), load_external_data=False),
                                            man)
    nodes = [n for n in out.graph.node if n.name.startswith("recguide_plugin_") and n.op_type != "Cast"
             or n.name == "recguide_plugin_cast_lengths"]
    g = helper.make_graph(nodes, "lengths",
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", "t", man.vocab_size])],
                          [helper.make_tensor_value_info("recguide_plugin_lengths", TensorProto.INT32, ["b"])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", man.opset)])
    onnx.checker.check_model(m)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"logits": np.zeros((3, 5, man.vocab_size), np.float32)})[0]
    assert got.dtype == np.int32 and got.tolist() == [5, 5, 5]


def test_rewrite_without_mismatch_node_is_identity(export_dir):
    man = ExportManifest.load(export_dir)
    model = onnx.load(str(export_dir / man.onnx_file), load_external_data=False)
    once = build.rewrite_mismatch_for_plugin(model, man)
    assert build.rewrite_mismatch_for_plugin(once, man) == once  # already rewritten: nothing to do


# ------------------------------------------------------------------------------------------------
# profile_shapes
# ------------------------------------------------------------------------------------------------
def test_profile_shapes(export_dir):
    man = ExportManifest.load(export_dir)
    dyn = [s.name for s in man.inputs if any(isinstance(d, str) for d in s.shape)]
    for name, prof in man.profiles.items():
        shapes = build.profile_shapes(man, name)
        assert sorted(shapes) == sorted(dyn) and "mismatch_tau" not in shapes
        (bmin, tmin), (bopt, topt), (bmax, tmax) = shapes["input_ids"]
        assert (bmin, bopt, bmax) == (prof.batch.min, prof.batch.opt, prof.batch.max)
        assert (tmin, topt, tmax) == (prof.tokens.min, prof.tokens.opt, prof.tokens.max)
        assert shapes["position_ids"] == shapes["input_ids"]
        for i, key in enumerate(("min", "opt", "max")):
            b, t, p = (getattr(getattr(prof, a), key) for a in ("batch", "tokens", "past"))
            assert shapes["attention_mask"][i] == (b, t, p + t)
            assert shapes["past_key_0"][i] == (b, man.num_kv_heads, p, man.head_dim)
            assert shapes[f"past_value_{man.num_layers - 1}"][i] == (b, man.num_kv_heads, p, man.head_dim)
        for mn, opt, mx in shapes.values():
            assert all(a <= b <= c for a, b, c in zip(mn, opt, mx))
    only = build.profile_shapes(man, "draft", inputs=["input_ids"])
    assert list(only) == ["input_ids"]
    with pytest.raises(ValueError, match="unknown profile"):
        build.profile_shapes(man, "decode")


# ------------------------------------------------------------------------------------------------
# With TensorRT (GPU machines)
# ------------------------------------------------------------------------------------------------
@pytest.mark.tensorrt
@pytest.mark.gpu
@pytest.mark.skipif(not has_tensorrt(), reason="TensorRT not installed")
def test_build_engine_fp32(export_dir, tmp_path):
    from recguide_trt.backends.tensorrt_backend import gpu_count

    if gpu_count() == 0:
        pytest.skip("no CUDA GPU")
    lib = build.find_plugin_library(os.environ.get("RECGUIDE_PLUGIN_LIB"))
    if lib is None:
        pytest.skip("plugin library not built (plugins/build/librecguide_plugins.so or $RECGUIDE_PLUGIN_LIB)")
    out = build.build_engine(export_dir, name="t", precision="fp32", plugin_lib=str(lib), out_root=tmp_path,
                             timing_cache=str(tmp_path / "timing.cache"))
    info = json.loads((out / build.ENGINE_INFO).read_text())
    assert (out / build.ENGINE_FILE).stat().st_size > 0 and (out / "manifest.json").is_file()
    assert sorted(info["profiles"]) == ["draft", "prefill", "verify"]
    assert "mismatch_tau" not in info["inputs"]
