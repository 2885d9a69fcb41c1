"""ONNX Runtime backend: the exported graph (``recguide_trt.engine.export``) with a numpy KV cache.

Same protocol and semantics as :class:`~recguide_trt.backends.torch_backend.TorchBackend`; the
graph computes argmax / top-k / probabilities itself, so only small arrays come back unless a row
wants logits. Batches outside the export's optimization profiles (``manifest.json``) are rejected
with a ValueError before anything runs, exactly as the TensorRT engine would reject them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..engine.manifest import MANIFEST_NAME, ExportManifest
from .base import ForwardBatch, ForwardOutput

PROVIDER_ALIASES = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "trt": "TensorrtExecutionProvider",
}
DEFAULT_TAU = 0.5


def resolve_providers(providers: list[str] | str | None, device: str = "cpu") -> list[str]:
    """Execution provider names (aliases cpu/cuda/tensorrt allowed); error when one is not installed."""
    import onnxruntime as ort

    if providers is None:
        providers = ["cuda", "cpu"] if str(device).startswith("cuda") else ["cpu"]
    if isinstance(providers, str):
        providers = [providers]
    names = [PROVIDER_ALIASES.get(p.lower(), p) for p in providers]
    available = ort.get_available_providers()
    missing = [n for n in names if n not in available]
    if missing:
        raise ValueError(f"ONNX Runtime execution provider(s) {', '.join(missing)} not available in this "
                         f"onnxruntime build (available: {', '.join(available)}); install onnxruntime-gpu "
                         "for CUDA/TensorRT")
    return names


def check_export_for(model: Any, export_dir: str | Path, slot_capacity: int) -> Path:
    """``export_dir`` when it is an export of checkpoint ``model`` whose profiles reach ``slot_capacity``.

    ValueError otherwise, saying what to re-export: the config fingerprint must match (an export of
    another model would run, but with the wrong weights), and the engine's context window must fit
    the export's ``max_model_len`` (else long requests would be rejected mid-generation).
    """
    export_dir = Path(export_dir)
    man = ExportManifest.load(export_dir)
    if model is not None and not isinstance(model, (str, Path)):
        model = getattr(model, "path", None)  # an in-memory model cannot be checked; a loaded checkpoint can
    if model is not None and (Path(model) / "config.json").is_file():
        from ..model.config import NLDConfig

        want = NLDConfig.from_json(Path(model) / "config.json").fingerprint()
        if man.config_fingerprint != want:
            raise ValueError(f"{export_dir} is an export of another model (config fingerprint "
                             f"{man.config_fingerprint}, {model} has {want}): re-export it with "
                             f"recguide export --model {model} --out DIR")
    if slot_capacity > man.max_model_len + 2 * max(man.block_sizes):  # the TensorRT backend's rule
        raise ValueError(f"{export_dir}: exported for max_model_len {man.max_model_len}, but this engine's KV "
                         f"slots hold {slot_capacity} tokens (max_model_len + 2 x max block): lower max_model_len "
                         f"or re-export for a longer one (recguide export --max-model-len N)")
    return export_dir


class OnnxRuntimeBackend:
    """Runs the exported NLD graph on packed batches; KV cache per layer ``[slots, n_kv, capacity, hd]``.

    ``model`` is an export directory (``manifest.json`` + ``model.onnx``), a checkpoint directory
    (exported on the fly into the cache, see :func:`~recguide_trt.engine.export.ensure_export`) or
    an in-memory :class:`~recguide_trt.model.backbone.NLDModel` (exported into a temporary
    directory owned by the backend). ``export_dir`` names a ready export of checkpoint ``model``
    instead (``LLM(name, backend="onnxruntime", export_dir=DIR)`` after ``recguide export --out DIR``):
    it is checked against the checkpoint's config and used as it is.
    """

    name = "onnxruntime"

    def __init__(self, model: Any, max_slots: int, slot_capacity: int, device: str = "cpu",
                 providers: list[str] | str | None = None, num_threads: int | None = None,
                 cache_dir: str | Path | None = None, tau: float = DEFAULT_TAU,
                 export_kwargs: dict[str, Any] | None = None, export_dir: str | Path | None = None):
        import onnxruntime as ort

        self._tmp = None
        if export_dir is not None:
            # A ready export (``recguide export --model M --out DIR``) of the checkpoint ``model``: no re-export.
            self.export_dir = check_export_for(model, export_dir, slot_capacity)
        else:
            self.export_dir = self._resolve_export(model, cache_dir, export_kwargs or {})
        self.manifest = ExportManifest.load(self.export_dir)
        man = self.manifest
        if man.dtype != "float32":
            raise ValueError(f"{self.export_dir}: dtype {man.dtype} not supported by this backend")
        self.max_slots = int(max_slots)
        self.slot_capacity = int(slot_capacity)
        self.vocab_size = man.vocab_size
        self.mask_token_id = man.mask_token_id
        self.eos_token_id = man.eos_token_id
        self.tau = float(tau)
        self.providers = resolve_providers(providers, device)
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if num_threads:
            opts.intra_op_num_threads = int(num_threads)
        self.session = ort.InferenceSession(str(self.export_dir / man.onnx_file), sess_options=opts,
                                            providers=self.providers)
        graph_inputs = [i.name for i in self.session.get_inputs()]
        if graph_inputs != man.input_names:
            raise ValueError(f"{self.export_dir}: graph inputs {graph_inputs} do not match the manifest's "
                             f"{man.input_names}")
        decode_rows = max(man.profiles[m].batch.max for m in ("draft", "verify"))
        if self.max_slots > decode_rows:
            raise ValueError(f"{self.export_dir}: the export's draft/verify profiles take at most {decode_rows} rows; "
                             f"max_num_seqs={self.max_slots} needs a re-export with max_batch >= {self.max_slots}")
        self.max_prefill_rows = man.profiles["prefill"].batch.max
        """Prompts prefilled together at most (the engine splits larger prefill batches)."""
        self.max_prefill_tokens = man.profiles["prefill"].tokens.max
        """Longest prompt the prefill profile takes."""
        self.max_draft_tokens = man.profiles["draft"].tokens.max
        """Largest draft block the draft profile takes."""
        shape = (self.max_slots, man.num_kv_heads, self.slot_capacity, man.head_dim)
        # Zeroed: masked positions get probability 0, but 0 × NaN from uninitialised memory is NaN.
        self.k_cache = [np.zeros(shape, dtype=np.float32) for _ in range(man.num_layers)]
        self.v_cache = [np.zeros(shape, dtype=np.float32) for _ in range(man.num_layers)]
        self.last_profile: str | None = None
        self.last_outputs: dict[str, np.ndarray] = {}
        """The fetched outputs of the latest forward (incl. ``flag_pos``/``correction``)."""

    # --------------------------------------------------------------------------------------------
    def _resolve_export(self, model: Any, cache_dir: Any, export_kwargs: dict[str, Any]) -> Path:
        from ..model.backbone import NLDModel

        if isinstance(model, NLDModel):
            import tempfile

            from ..engine.export import export_onnx

            self._tmp = tempfile.TemporaryDirectory(prefix="recguide-onnx-")
            return export_onnx(model, self._tmp.name, **export_kwargs)
        path = Path(model)
        if (path / MANIFEST_NAME).is_file():
            return path
        if (path / "config.json").is_file():
            return self.export_checkpoint(path, cache_dir, **export_kwargs)
        raise FileNotFoundError(f"{path}: neither an ONNX export ({MANIFEST_NAME}) nor a checkpoint (config.json)")

    @staticmethod
    def export_checkpoint(checkpoint_dir: str | Path, cache_dir: str | Path | None = None, **kwargs: Any) -> Path:
        """Export ``checkpoint_dir`` into the cache (keyed by config fingerprint + weights) once; return it."""
        from ..engine.export import ensure_export

        return ensure_export(checkpoint_dir, cache_dir, **kwargs)

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: str | Path, max_slots: int, slot_capacity: int,
                        cache_dir: str | Path | None = None, **kwargs: Any) -> OnnxRuntimeBackend:
        return cls(checkpoint_dir, max_slots, slot_capacity, cache_dir=cache_dir, **kwargs)

    # --------------------------------------------------------------------------------------------
    def check(self, batch: ForwardBatch) -> str:
        """Validate shapes, slots and capacities; return the profile the batch runs under."""
        B, T = batch.input_ids.shape
        P = batch.validate(self.max_slots, self.slot_capacity, self.vocab_size)
        return self.manifest.select_profile((B, T), P)

    def forward(self, batch: ForwardBatch, tau: float | None = None) -> ForwardOutput:
        profile = self.check(batch)
        man = self.manifest
        B, T = batch.input_ids.shape
        past_lens = np.asarray(batch.past_lens, dtype=np.int64)
        slots = np.asarray(batch.slots, dtype=np.int64)
        P = int(past_lens.max(initial=0))
        past_valid = np.arange(P)[None, :] < past_lens[:, None]
        mask = np.concatenate([np.broadcast_to(past_valid[:, None, :], (B, T, P)),
                               np.asarray(batch.intra_mask, dtype=bool)], axis=-1)
        feed: dict[str, np.ndarray] = {
            "input_ids": np.ascontiguousarray(batch.input_ids, dtype=np.int64),
            "position_ids": np.ascontiguousarray(batch.position_ids, dtype=np.int64),
            "attention_mask": np.ascontiguousarray(mask),
            "mismatch_tau": np.array([self.tau if tau is None else tau], dtype=np.float32),
        }
        if "draft_gate" in man.input_names:
            feed["draft_gate"] = np.ascontiguousarray(batch.draft_gate, dtype=np.float32)
        contiguous = bool(np.array_equal(slots, np.arange(B)))
        for i, (kc, vc) in enumerate(zip(self.k_cache, self.v_cache)):
            # ORT wants C-contiguous buffers: slicing the capacity axis (or gathering slots) copies.
            feed[f"past_key_{i}"] = np.ascontiguousarray(kc[:B, :, :P] if contiguous else kc[slots, :, :P])
            feed[f"past_value_{i}"] = np.ascontiguousarray(vc[:B, :, :P] if contiguous else vc[slots, :, :P])
        want = bool(np.any(batch.want_logits))
        names = [f"present_{kind}_{i}" for i in range(man.num_layers) for kind in ("key", "value")]
        names += ["argmax_ids", "top_ids", "top_probs", "flag_pos", "correction"] + (["logits"] if want else [])
        outs = dict(zip(names, self.session.run(names, feed)))
        # Write in reverse row order so that, should two rows share a slot, the first row's K/V win.
        for b in range(B - 1, -1, -1) if batch.write_kv else ():
            s, p0 = int(slots[b]), int(past_lens[b])
            for i, (kc, vc) in enumerate(zip(self.k_cache, self.v_cache)):
                kc[s, :, p0:p0 + T] = outs[f"present_key_{i}"][b]
                vc[s, :, p0:p0 + T] = outs[f"present_value_{i}"][b]
        self.last_profile = profile
        self.last_outputs = {k: outs[k] for k in ("flag_pos", "correction")}
        return ForwardOutput(argmax=outs["argmax_ids"].astype(np.int64, copy=False),
                             top_ids=outs["top_ids"].astype(np.int64, copy=False),
                             top_probs=outs["top_probs"].astype(np.float32, copy=False),
                             logits=outs["logits"] if want else None)

    def launch(self, batch: ForwardBatch, stream=None):
        """ONNX Runtime runs synchronously on the CPU: the forward happens here."""
        return self.forward(batch)

    def collect(self, pending) -> ForwardOutput:
        return pending

    def copy_slot(self, src: int, dst: int, length: int) -> None:
        for kc, vc in zip(self.k_cache, self.v_cache):
            kc[dst, :, :length] = kc[src, :, :length]
            vc[dst, :, :length] = vc[src, :, :length]
