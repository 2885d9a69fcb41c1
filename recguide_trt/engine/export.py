"""Export an NLD checkpoint to one ONNX graph (+ ``manifest.json``) for ONNX Runtime and TensorRT.

The graph (DESIGN.md §4) takes the new tokens, their positions, the full attention mask
``[B, T, P + T]`` (the mask alone selects causal / draft-block / fused-row attention), the cached
K/V of every layer and, when the checkpoint has a draft adapter, the per-token ``draft_gate``.
It returns the new tokens' K/V, the full ``logits`` (sampling path), ``argmax_ids`` and the
mismatch-prediction outputs computed in-graph with the MASK token excluded: ``top_ids``
``[B, T, 3]``, ``top_probs`` ``[B, T, 2]`` and per row ``flag_pos`` / ``correction`` (semantics of
``recguide_trt.runtime.mismatch``, with ``mismatch_tau`` an input and EOS from the config).

**One graph, logits included.** ``argmax_ids`` and ``top_ids`` need the full ``[B, T, V]``
logits anyway, so a second "sampling" graph would save no arithmetic; ``logits`` is simply an
output that greedy consumers do not fetch (ONNX Runtime still computes it as the intermediate of
argmax/top-k; TensorRT keeps it in device memory and nobody copies it to the host). One graph
means one engine with three profiles instead of two engines sharing weights.

**The mismatch op.** The top-k/softmax/flag computation is packaged as an ONNX model-local
function ``recguide::MismatchPredict`` (inputs ``logits``, ``mismatch_tau``; outputs
``top_ids``, ``top_probs``, ``flag_pos``, ``correction``; attributes ``mask_token_id``,
``eos_token_id``, ``topk``). ONNX Runtime executes the function body (standard ops) on any
execution provider. The TensorRT build maps it to the fused plugin (plugins/mismatch_predict.cu)
by dropping the function body from ``model.functions``: TensorRT's ONNX parser then imports the
unknown node as the plugin whose name is the op type, with the attributes as plugin fields. The
plugin takes ``(logits, lengths)`` with ``tau`` as an attribute and returns int32, so the build
rewrites the node's inputs/attributes and casts the outputs (see the manifest's ``custom_ops``).
Deviation from the kernel: the graph has no per-row ``lengths`` input (all T positions are
valid), so for right-padded rows a ``flag_pos`` at or beyond the row's length means "no flag".
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..backends.base import TOPK
from ..cache import permissions_as_umask
from ..model.backbone import NLDModel
from ..model.checkpoint import ADAPTER_DIR, _weight_files, load_checkpoint
from .export_args import DEFAULT_OPSET, add_export_arguments
from .manifest import ExportManifest, TensorSpec, derive_profiles

ONNX_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
CUSTOM_DOMAIN = "recguide"
MISMATCH_OP = "MismatchPredict"
MISMATCH_INPUTS = ["logits", "mismatch_tau"]
MISMATCH_OUTPUTS = ["top_ids", "top_probs", "flag_pos", "correction"]


# ------------------------------------------------------------------------------------------------
# The graph
# ------------------------------------------------------------------------------------------------
def mismatch_predict_torch(logits: torch.Tensor, tau: torch.Tensor, mask_token_id: int,
                           eos_token_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-3 ids / top-2 probs (MASK excluded) and the first flagged position of each row.

    ``logits`` ``[B, T, V]``; ``tau`` ``[1]``. Returns ``top_ids`` ``[B, T, 3]`` int64,
    ``top_probs`` ``[B, T, 2]`` float32, ``flag_pos`` ``[B]`` int64 (first ``i >= 1`` with
    ``1 - (p1 - p2) > tau``, else -1) and ``correction`` ``[B]`` int64 (best of top-2/top-3 at
    ``flag_pos`` that is not EOS; -1 without a flag). Written in ops that export to plain ONNX.
    """
    logits = logits.float()
    vocab = logits.shape[-1]
    is_mask = torch.arange(vocab, device=logits.device) == mask_token_id
    masked = logits.masked_fill(is_mask, float("-inf"))
    top_vals, top_ids = torch.topk(masked, TOPK, dim=-1)
    top1 = top_vals[..., :1]
    denom = torch.exp(masked - top1).sum(-1, keepdim=True)
    top_probs = torch.exp(top_vals[..., :2] - top1) / denom
    risk = 1.0 - (top_probs[..., 0] - top_probs[..., 1])
    # Position 0 (the seed) is never flagged. Slicing instead of arange(T): the graph must take its
    # sizes from its own inputs so that it can be cut out as the MismatchPredict function.
    above = risk > tau
    flagged = torch.cat([torch.zeros_like(above[:, :1]), above[:, 1:]], dim=1)
    any_flag = flagged.any(-1)
    first = flagged.to(torch.float32).argmax(-1)
    cand = torch.gather(top_ids, 1, first[:, None, None].expand(-1, 1, TOPK))[:, 0]
    correction = torch.where(cand[:, 1] != eos_token_id, cand[:, 1], cand[:, 2])
    none = torch.full_like(first, -1)
    return top_ids, top_probs, torch.where(any_flag, first, none), torch.where(any_flag, correction, none)


class ExportWrapper(nn.Module):
    """The exported function: backbone + argmax + mismatch prediction, flat inputs and outputs."""

    def __init__(self, model: NLDModel):
        super().__init__()
        self.model = model
        cfg = model.config
        self.mask_token_id = cfg.mask_token_id
        self.eos_token_id = cfg.eos_token_id

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
                past: list[tuple[torch.Tensor, torch.Tensor]], draft_gate: torch.Tensor,
                mismatch_tau: torch.Tensor) -> tuple[torch.Tensor, ...]:
        gate = draft_gate if self.model.has_draft_adapter else None
        logits, present = self.model(input_ids, position_ids, attention_mask, past, gate)
        logits = logits.float()
        argmax_ids = logits.argmax(-1)
        top_ids, top_probs, flag_pos, correction = mismatch_predict_torch(
            logits, mismatch_tau, self.mask_token_id, self.eos_token_id)
        flat = [t for kv in present for t in kv]
        return (*flat, logits, argmax_ids, top_ids, top_probs, flag_pos, correction)


def io_names(num_layers: int, has_adapter: bool) -> tuple[list[str], list[str]]:
    inputs = ["input_ids", "position_ids", "attention_mask"]
    for i in range(num_layers):
        inputs += [f"past_key_{i}", f"past_value_{i}"]
    if has_adapter:
        inputs.append("draft_gate")
    inputs.append("mismatch_tau")
    outputs = []
    for i in range(num_layers):
        outputs += [f"present_key_{i}", f"present_value_{i}"]
    outputs += ["logits", "argmax_ids", *MISMATCH_OUTPUTS]
    return inputs, outputs


def tensor_specs(model: NLDModel, dtype: str) -> tuple[list[TensorSpec], list[TensorSpec]]:
    cfg = model.config
    n_kv, hd, vocab = cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size
    in_names, out_names = io_names(cfg.num_hidden_layers, model.has_draft_adapter)
    shapes: dict[str, tuple[str, list[int | str]]] = {
        "input_ids": ("int64", ["batch", "tokens"]),
        "position_ids": ("int64", ["batch", "tokens"]),
        "attention_mask": ("bool", ["batch", "tokens", "past+tokens"]),
        "draft_gate": (dtype, ["batch", "tokens"]),
        "mismatch_tau": ("float32", [1]),
        "logits": ("float32", ["batch", "tokens", vocab]),
        "argmax_ids": ("int64", ["batch", "tokens"]),
        "top_ids": ("int64", ["batch", "tokens", TOPK]),
        "top_probs": ("float32", ["batch", "tokens", 2]),
        "flag_pos": ("int64", ["batch"]),
        "correction": ("int64", ["batch"]),
    }
    for i in range(cfg.num_hidden_layers):
        for kind in ("key", "value"):
            shapes[f"past_{kind}_{i}"] = (dtype, ["batch", n_kv, "past", hd])
            shapes[f"present_{kind}_{i}"] = (dtype, ["batch", n_kv, "tokens", hd])
    return ([TensorSpec(n, *shapes[n]) for n in in_names], [TensorSpec(n, *shapes[n]) for n in out_names])


def _example_inputs(model: NLDModel, dtype: torch.dtype) -> tuple[Any, ...]:
    # Sizes >= 2 and pairwise distinct so that torch.export specializes none of the dynamic dims.
    cfg = model.config
    b, t, p = 2, 3, 5
    past = [(torch.zeros(b, cfg.num_key_value_heads, p, cfg.head_dim, dtype=dtype),
             torch.zeros(b, cfg.num_key_value_heads, p, cfg.head_dim, dtype=dtype))
            for _ in range(cfg.num_hidden_layers)]
    return (torch.zeros(b, t, dtype=torch.long), torch.arange(t).repeat(b, 1) + p,
            torch.ones(b, t, p + t, dtype=torch.bool), past, torch.ones(b, t, dtype=dtype),
            torch.tensor([0.5], dtype=torch.float32))


def _dynamic_shapes(num_layers: int) -> tuple[Any, ...]:
    dyn = torch.export.Dim.DYNAMIC
    bt = {0: dyn, 1: dyn}
    kv = {0: dyn, 2: dyn}
    return (bt, bt, {0: dyn, 1: dyn, 2: dyn}, [(kv, kv) for _ in range(num_layers)], bt, None)


# ------------------------------------------------------------------------------------------------
# ONNX post-processing
# ------------------------------------------------------------------------------------------------
def _rename_dims(graph: Any, manifest_specs: list[TensorSpec]) -> None:
    """Give the graph's inputs/outputs the manifest's symbolic dim names (batch, tokens, past)."""
    by_name = {s.name: s for s in manifest_specs}
    for value in list(graph.input) + list(graph.output):
        spec = by_name.get(value.name)
        if spec is None:
            continue
        dims = value.type.tensor_type.shape.dim
        for dim, want in zip(dims, spec.shape):
            if isinstance(want, str):
                dim.ClearField("dim_value")
                dim.dim_param = want


def _extract_mismatch_function(model: Any, cfg: Any) -> dict[str, Any]:
    """Move the nodes computing the mismatch outputs into a local function ``recguide::MismatchPredict``."""
    import onnx
    from onnx import helper

    graph = model.graph
    producers = {out: node for node in graph.node for out in node.output}
    inits = {init.name: init for init in graph.initializer}
    boundary = set(MISMATCH_INPUTS)
    body_ids: set[int] = set()
    used_inits: set[str] = set()
    stack = list(MISMATCH_OUTPUTS)
    seen: set[str] = set()
    while stack:
        name = stack.pop()
        if name in seen or name in boundary or not name:
            continue
        seen.add(name)
        if name in inits:
            used_inits.add(name)
            continue
        node = producers.get(name)
        if node is None:
            raise RuntimeError(f"mismatch subgraph reaches {name!r}, which is neither an input nor produced")
        if id(node) in body_ids:
            continue
        body_ids.add(id(node))
        stack.extend(node.input)
    body = [n for n in graph.node if id(n) in body_ids]
    # The body must be closed: none of its intermediate values may be used outside it.
    body_values = {o for n in body for o in n.output} - set(MISMATCH_OUTPUTS)
    for node in graph.node:
        if id(node) not in body_ids and body_values.intersection(node.input):
            raise RuntimeError(f"node {node.name} outside the mismatch subgraph uses its intermediates")
    outside_inits = {i for n in graph.node if id(n) not in body_ids for i in n.input}
    consts = [helper.make_node("Constant", [], [name], value=inits[name]) for name in sorted(used_inits)]
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    func = helper.make_function(
        CUSTOM_DOMAIN, MISMATCH_OP, MISMATCH_INPUTS, MISMATCH_OUTPUTS, consts + body,
        opset_imports=[helper.make_opsetid("", opset)], attributes=["mask_token_id", "eos_token_id", "topk"])
    call = helper.make_node(MISMATCH_OP, MISMATCH_INPUTS, MISMATCH_OUTPUTS, name="recguide_mismatch_predict",
                            domain=CUSTOM_DOMAIN, mask_token_id=cfg.mask_token_id,
                            eos_token_id=cfg.eos_token_id, topk=TOPK)
    keep = [n for n in graph.node if id(n) not in body_ids]
    # Insert the call right after the producer of logits (keeps the node list topologically sorted).
    idx = next(i for i, n in enumerate(keep) if "logits" in n.output) + 1
    del graph.node[:]
    graph.node.extend(keep[:idx] + [call] + keep[idx:])
    remaining = [init for init in graph.initializer if init.name not in used_inits or init.name in outside_inits]
    del graph.initializer[:]
    graph.initializer.extend(remaining)
    # Intermediate value_info of moved nodes would dangle; drop them.
    vis = [v for v in graph.value_info if v.name not in body_values]
    del graph.value_info[:]
    graph.value_info.extend(vis)
    model.functions.append(func)
    model.opset_import.append(onnx.helper.make_opsetid(CUSTOM_DOMAIN, 1))
    return {
        "domain": CUSTOM_DOMAIN, "op_type": MISMATCH_OP, "node_name": call.name, "version": 1,
        "inputs": MISMATCH_INPUTS, "outputs": MISMATCH_OUTPUTS,
        "attributes": {"mask_token_id": cfg.mask_token_id, "eos_token_id": cfg.eos_token_id, "topk": TOPK},
        "onnxruntime": "model-local function (standard ONNX ops), runs on every execution provider",
        "tensorrt": "drop the function from model.functions so the parser imports the node as plugin "
                    f"'{MISMATCH_OP}' (plugins/mismatch_plugin.cpp). The plugin's signature differs: "
                    "inputs (logits, lengths int32 [B]) with tau as a float attribute, int32 outputs; "
                    "the build must rewrite the node (lengths = T for every row, tau from the runtime "
                    "config, Cast int32 -> int64 after it)",
        "semantics": "recguide_trt.runtime.mismatch: MASK excluded, position 0 skipped, "
                     "risk = 1 - (p1 - p2) > tau, correction = best of top-2/top-3 != EOS",
    }


def _drop_unused_inputs(graph: Any, keep: set[str]) -> None:
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    inputs = [v for v in graph.input if v.name in used or v.name in keep]
    del graph.input[:]
    graph.input.extend(inputs)


# ------------------------------------------------------------------------------------------------
# Public entry points
# ------------------------------------------------------------------------------------------------
def default_block_sizes(max_block: int) -> list[int]:
    """Powers of two from 2 up to ``max_block``, plus ``max_block`` itself."""
    sizes = {max_block}
    b = 2
    while b < max_block:
        sizes.add(b)
        b *= 2
    return sorted(sizes)


def weights_key(checkpoint_dir: str | Path) -> str:
    """Hash of config + weight (and adapter) files' names, sizes and mtimes: the export-cache key."""
    path = Path(checkpoint_dir)
    files = [path / "config.json", *_weight_files(path)]
    adapter = path / ADAPTER_DIR
    if adapter.is_dir():
        files += sorted(p for p in adapter.iterdir() if p.is_file())
    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        h.update(f"{f.relative_to(path)}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()[:16]


def export_onnx(checkpoint_dir: str | Path | NLDModel, out_dir: str | Path, *, opset: int = DEFAULT_OPSET,
                max_block: int | None = None, block_sizes: list[int] | None = None,
                max_model_len: int | None = None, max_batch: int = 64, opt_batch: int = 8,
                max_prefill_batch: int = 8, max_prefill_tokens: int | None = None,
                opt_past: int | None = None, dtype: str = "float32", mismatch_op: bool = True,
                verbose: bool = False) -> Path:
    """Export a checkpoint directory (or an in-memory :class:`NLDModel`) to ``out_dir``.

    Writes ``model.onnx`` + ``model.onnx.data`` (external weights) and ``manifest.json``; returns
    ``out_dir``. ``block_sizes`` (default: powers of two up to ``max_block``, itself defaulting to
    the config's ``block_size``) and ``max_model_len`` (default: ``max_position_embeddings``) size
    the optimization profiles. Only ``float32`` graphs are exported: TensorRT lowers precision at
    build time (FP16/BF16 builder flags), and ONNX Runtime on CPU wants float32.
    """
    import onnx

    if dtype not in ("float32", "fp32"):
        raise ValueError(f"export dtype {dtype!r} not supported: export float32 and let the TensorRT build "
                         "lower precision")
    dtype = "float32"
    if isinstance(checkpoint_dir, NLDModel):
        model, wkey = checkpoint_dir, "in-memory"
    else:
        model, wkey = load_checkpoint(checkpoint_dir, dtype="float32").model, weights_key(checkpoint_dir)
    model = model.float().eval()
    cfg = model.config
    max_block = int(max_block or cfg.block_size)
    block_sizes = sorted({int(b) for b in (block_sizes or default_block_sizes(max_block))})
    max_model_len = int(max_model_len or cfg.max_position_embeddings)
    profiles = derive_profiles(block_sizes, max_model_len, max_batch=max_batch, opt_batch=opt_batch,
                               max_prefill_batch=max_prefill_batch, max_prefill_tokens=max_prefill_tokens,
                               opt_past=opt_past)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in (ONNX_FILE, DATA_FILE):
        (out_dir / stale).unlink(missing_ok=True)
    in_specs, out_specs = tensor_specs(model, dtype)
    in_names, out_names = io_names(cfg.num_hidden_layers, model.has_draft_adapter)
    export_in_names = in_names if model.has_draft_adapter else in_names[:-1] + ["draft_gate", "mismatch_tau"]

    wrapper = ExportWrapper(model).eval()
    t0 = time.perf_counter()
    with torch.no_grad():
        program = torch.onnx.export(
            wrapper, _example_inputs(model, torch.float32), dynamo=True, opset_version=opset,
            dynamic_shapes=_dynamic_shapes(cfg.num_hidden_layers), input_names=export_in_names,
            output_names=out_names, verbose=verbose, optimize=True)
    onnx_model = program.model_proto
    graph = onnx_model.graph
    _drop_unused_inputs(graph, keep=set(in_names))
    got_inputs = [v.name for v in graph.input]
    if got_inputs != in_names:
        raise RuntimeError(f"exported graph inputs {got_inputs} differ from the expected {in_names}")
    custom_ops = [_extract_mismatch_function(onnx_model, cfg)] if mismatch_op else []
    _rename_dims(graph, in_specs + out_specs)
    # Weights go to one external file; small tensors and Constant-node attributes (shape constants,
    # the function's MASK one-hot) stay inline, where shape inference can read them.
    from onnx.external_data_helper import convert_model_to_external_data

    convert_model_to_external_data(onnx_model, all_tensors_to_one_file=True, location=DATA_FILE,
                                   size_threshold=1024, convert_attribute=False)
    onnx.save_model(onnx_model, str(out_dir / ONNX_FILE))
    onnx.checker.check_model(str(out_dir / ONNX_FILE))
    seconds = time.perf_counter() - t0

    import onnxscript  # noqa: F401  (the exporter needs it; record its version)

    manifest = ExportManifest(
        config_fingerprint=cfg.fingerprint(), weights_key=wkey, dtype=dtype,
        num_layers=cfg.num_hidden_layers, num_kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
        hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size, mask_token_id=cfg.mask_token_id,
        eos_token_id=cfg.eos_token_id, max_model_len=max_model_len, block_sizes=block_sizes,
        has_draft_adapter=model.has_draft_adapter, topk=TOPK, inputs=in_specs, outputs=out_specs,
        profiles=profiles, onnx_file=ONNX_FILE, external_data=DATA_FILE, opset=opset, custom_ops=custom_ops,
        exporter={"torch": torch.__version__, "onnx": onnx.__version__,
                  "onnxscript": getattr(onnxscript, "__version__", "?"), "seconds": f"{seconds:.1f}"})
    manifest.save(out_dir)
    return out_dir


def default_cache_dir() -> Path:
    """Where on-the-fly exports go: ``$RECGUIDE_CACHE/onnx`` (:mod:`recguide_trt.cache`)."""
    from ..cache import cache_root

    return cache_root() / "onnx"


def ensure_export(checkpoint_dir: str | Path, cache_dir: str | Path | None = None, **export_kwargs: Any) -> Path:
    """Export ``checkpoint_dir`` once into the cache and return the export directory.

    The cache entry is keyed by the config fingerprint, the weight files' sizes/mtimes and the
    export options; a finished entry (manifest written last) is reused, a new one is written to a
    temporary directory and renamed into place, so concurrent callers never see half an export.
    """
    from ..model.config import NLDConfig

    checkpoint_dir = Path(checkpoint_dir)
    cfg = NLDConfig.from_json(checkpoint_dir / "config.json")
    opts = json.dumps(export_kwargs, sort_keys=True, default=str)
    key = hashlib.sha256(f"{weights_key(checkpoint_dir)}|{opts}".encode()).hexdigest()[:12]
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / f"{cfg.fingerprint()}-{key}"
    if (target / "manifest.json").is_file() and (target / ONNX_FILE).is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
    try:
        export_onnx(checkpoint_dir, tmp, **export_kwargs)
        permissions_as_umask(tmp)  # mkdtemp's 0700: the cache may be shared
        try:
            os.replace(tmp, target)
        except OSError:  # another process won the race, or a stale partial entry is in the way
            if not (target / "manifest.json").is_file():
                shutil.rmtree(target, ignore_errors=True)
                os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def main_export(args: argparse.Namespace) -> int:
    """``recguide export --model NAME|DIR --out DIR``: export and print where the files went."""
    from ..models import resolve_model

    out = export_onnx(resolve_model(args.model), args.out, opset=args.opset, max_block=args.max_block,
                      block_sizes=args.block_sizes, max_model_len=args.max_model_len, max_batch=args.max_batch,
                      opt_batch=args.opt_batch, max_prefill_batch=args.max_prefill_batch,
                      max_prefill_tokens=args.max_prefill_tokens, mismatch_op=not args.no_mismatch_op)
    manifest = ExportManifest.load(out)
    print(f"exported {args.model} -> {out / manifest.onnx_file} (+ {manifest.external_data}, manifest.json)")
    for name, prof in manifest.profiles.items():
        print(f"  profile {name}: batch {prof.batch}, tokens {prof.tokens}, past {prof.past}")
    return 0


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="python -m recguide_trt.engine.export")
    add_export_arguments(_parser)
    raise SystemExit(main_export(_parser.parse_args()))
