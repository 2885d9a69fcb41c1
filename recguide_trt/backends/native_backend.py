"""The native CPU backend: the whole forward in one C++ call (``native/nld_cpu.cpp``).

Same model, same KV-cache layout (``[slots, n_kv, capacity, head_dim]`` per layer, float32) and the
same :class:`~.base.Backend` contract as :class:`~.torch_backend.TorchBackend`, without its per-op
Python dispatch: token-wise layers run on each row's real tokens only, attention reads each row's
own cached past in place (no gather, no padding to the longest row, no ``[B, T, P + T]`` mask)
and the head's argmax / top-3 / probabilities are reduced in the same call. A prefill forward
(``ForwardBatch.last_only``) runs the head on each row's last token only.
"""

from __future__ import annotations

import numpy as np
import torch

from ..model.backbone import GatedLinear, NLDModel, rope_inv_freq
from .base import ForwardBatch, ForwardOutput
from .choice import check_native_dtypes
from .native.build import load_native


def _adapter(lin: GatedLinear) -> tuple[torch.Tensor, torch.Tensor]:
    """(A [r, in], B·scale [out, r]) of one projection's draft adapter; zeros where it has none."""
    if lin.lora_A is None:
        return torch.zeros(1, lin.weight.shape[1]), torch.zeros(lin.weight.shape[0], 1)
    return lin.lora_A.weight.detach().float(), lin.lora_B.weight.detach().float() * lin.lora_scale


def _stack_adapters(lins: list[GatedLinear]) -> tuple[torch.Tensor, torch.Tensor]:
    """One adapter for projections that share an input: A stacked, B block-diagonal.

    A row of gate 0 has an all-zero low-rank product, so it adds exactly 0 to the base output
    (verify and AR rows stay the base model's, as in the reference).
    """
    parts = [_adapter(lin) for lin in lins]
    a = torch.cat([p[0] for p in parts], 0)
    return a.contiguous(), torch.block_diag(*[p[1] for p in parts]).contiguous()


class NativeBackend:
    """Runs :class:`NLDModel` (float32 arithmetic, CPU) through the compiled native forward.

    The model may hold bfloat16 weights (``LLM`` loads a bf16 checkpoint that way for this backend): they
    are packed as they are, and no float32 copy of a matrix or of the embedding table is kept.
    """

    name = "native"
    reads_slots_in_place = True
    """Attention reads each row's past from its own slot, wherever it is: the engine need not keep running
    requests in slots 0 … n-1."""
    max_prefill_rows = 4
    """Prompts prefilled per forward (the engine splits larger prefills): a prefill is compute-bound,
    and a few prompts' activations stay in cache where 64 prompts' do not (a 64-prompt prefill ran
    faster in forwards of 4 than in one, on the 2-core EPYC)."""
    packs_rows = True
    """Every op runs on the rows' real tokens only (no padding): a step costs its total tokens."""

    def __init__(self, model: NLDModel, max_slots: int, slot_capacity: int, source=None,
                 compute_dtype: str = "float32", kv_cache_dtype: str = "float32"):
        """``source``: another ``nld_cpu.cpp`` to build and run (a benchmark's "before" kernel).

        ``compute_dtype``: ``"float32"`` (default: float32 arithmetic, the checkpoint's model) or
        ``"bfloat16"``: the projections and the head multiply bf16 activations by bf16 weights into
        float32 sums, while norms, RoPE, attention, the KV cache and the softmax stay float32. On CPUs
        with AMX-BF16 (Intel Xeon from Sapphire Rapids) the products run on AMX tiles (``TDPBF16PS``,
        ~3 TFLOP/s a core); on others with AVX512_BF16 on ``vdpbf16ps`` (half the FMAs); CPUs with
        neither emulate the instruction (slower than float32). :attr:`bf16_dot` says which;
        ``RECGUIDE_NATIVE_AMX=0`` when the backend is made keeps AMX off. Lossless against its own AR,
        like every policy, on each of these paths; its tokens may differ from the float32 model's
        where the top two logits are close.

        ``kv_cache_dtype``: ``"float32"`` (default) or ``"bfloat16"``: each new key and value is rounded
        to bf16 as it is computed, so the step that computes it and every later step that reads it
        back from the cache see the same value (lossless against its own AR), and the cache holds
        half the bytes per token.
        """
        check_native_dtypes(compute_dtype, kv_cache_dtype, allow_none=False)
        cfg = model.config
        p = next(model.parameters())
        if p.dtype not in (torch.float32, torch.bfloat16) or p.device.type != "cpu":
            raise ValueError(f"the native backend computes in float32 on the CPU from float32 or bfloat16 weights; "
                             f"got {p.dtype} on {p.device} (use dtype=None/'float32' and device='cpu', or "
                             f"backend='torch')")
        self.config = cfg
        self.device = torch.device("cpu")
        self.dtype = torch.float32
        self.max_slots = max_slots
        self.slot_capacity = slot_capacity
        self.vocab_size = cfg.vocab_size
        self.mask_token_id = cfg.mask_token_id
        ext = load_native(source)
        self.kernel = ext.kernel_key
        """The compiled kernel's identity (source, compiler flags, torch, Python, CPU flags): a cached
        step-cost table is measured per kernel, so a new build re-measures it."""
        self.compute_dtype = compute_dtype
        self.kv_cache_dtype = kv_cache_dtype
        self.bf16_dot = ext.bf16_dot() if hasattr(ext, "bf16_dot") else "none"  # an older kernel has none
        """How bf16 compute multiplies: ``"amx_bf16"`` (AMX tiles), ``"avx512_bf16"`` (the pair dot
        instruction) or ``"emulated"`` (two float32 FMAs; for CPUs without either, and tests)."""
        with torch.no_grad():
            layers = []
            for layer in model.encoder.layers:
                at, mlp = layer.self_attn, layer.mlp
                base = [layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                        torch.cat([at.q_proj.weight, at.k_proj.weight, at.v_proj.weight], 0), at.o_proj.weight,
                        torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight], 0), mlp.down_proj.weight]
                # Matrices go in as stored (packing widens them, exactly, one at a time); norms as float32.
                tensors = [t.detach().float().contiguous() if t.ndim == 1 else t.detach().contiguous() for t in base]
                if model.has_draft_adapter:
                    for group in ([at.q_proj, at.k_proj, at.v_proj], [at.o_proj],
                                  [mlp.gate_proj, mlp.up_proj], [mlp.down_proj]):
                        tensors += list(_stack_adapters(group))
                layers.append(tensors)
            positions = torch.arange(slot_capacity + 1, dtype=torch.float32)
            # From the config, in float32: a model converted with .to(bfloat16) carries a rounded inv_freq buffer.
            freqs = positions[:, None] * rope_inv_freq(cfg.rope, cfg.head_dim)[None, :]
            cos = (freqs.cos() * model.rope_scale).contiguous()
            sin = (freqs.sin() * model.rope_scale).contiguous()
            embed = model.encoder.embed_tokens.weight.detach()  # bf16 rows are widened per lookup
            embed = embed.contiguous() if embed.dtype == torch.bfloat16 else embed.float().contiguous()
            args = (embed, layers, model.encoder.norm.weight.detach().float().contiguous(),
                    model.diffusion_head.weight.detach().contiguous(), cos, sin,
                    cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                    cfg.rms_norm_eps, cfg.mask_token_id, max_slots, slot_capacity, torch.get_num_threads())
            options = (compute_dtype == "bfloat16", kv_cache_dtype == "bfloat16")
            try:
                self._impl = ext.NLDCpu(*args, *options)
            except TypeError:
                if source is None or any(options):
                    raise
                self._impl = ext.NLDCpu(*args)  # an older kernel (a benchmark's "before") has neither option
        if cfg.attention_bias or cfg.qk_norm:
            if not hasattr(self._impl, "set_attention_extras"):
                raise ValueError("this native kernel predates q/k/v biases and q/k norms (Qwen2, Qwen3)")
            none = torch.empty(0)
            for i, layer in enumerate(model.encoder.layers):
                at = layer.self_attn
                bias = torch.cat([at.q_proj.bias, at.k_proj.bias, at.v_proj.bias]) if cfg.attention_bias else none
                qn, kn = (at.q_norm.weight, at.k_norm.weight) if cfg.qk_norm else (none, none)
                self._impl.set_attention_extras(i, *(t.detach().float().contiguous() for t in (bias, qn, kn)))
        if model.draft_mask_embedding is not None:
            self._impl.set_draft_mask_embedding(model.draft_mask_embedding.detach().float().contiguous())
        self._has_adapter = model.has_draft_adapter
        beta = cfg.rope.llama_4_scaling_beta
        self._q_beta = float(beta) if beta else 0.0
        self._q_period = cfg.rope.original_max_position_embeddings
        self._empty_f = torch.empty(0, dtype=torch.float32)

    @property
    def k_cache(self) -> list[torch.Tensor]:
        return self._impl.k_cache()

    @property
    def v_cache(self) -> list[torch.Tensor]:
        return self._impl.v_cache()

    # -- profiling -------------------------------------------------------------------------
    def set_timing(self, on: bool) -> None:
        """Accumulate per-phase seconds inside the forward (see :meth:`timings`); off by default."""
        self._impl.set_timing(on)
        self._impl.reset_timings()

    def timings(self) -> dict[str, float]:
        """Seconds per phase since :meth:`set_timing` (norm_embed, qkv_proj, attention, mlp, head, ...)."""
        return dict(self._impl.timings())

    # -- the Backend contract ----------------------------------------------------------------
    def forward(self, batch: ForwardBatch) -> ForwardOutput:
        return self.collect(self.launch(batch))

    def launch(self, batch: ForwardBatch, stream=None):
        """Runs the forward now (the CPU has no streams; the threaded stream executor overlaps calls)."""
        return self._run(batch)

    def collect(self, pending) -> ForwardOutput:
        return pending

    def _run(self, batch: ForwardBatch) -> ForwardOutput:
        B, T = batch.input_ids.shape
        batch.validate(self.max_slots, self.slot_capacity, self.vocab_size)  # the kernel reads ids unchecked
        lens = np.full(B, T, np.int64) if batch.row_lens is None else np.asarray(batch.row_lens, np.int64)
        # Every row full: the padded layout is the packed one; else the real tokens' flat indices.
        flat = None if bool((lens == T).all()) else np.flatnonzero(np.arange(T)[None, :] < lens[:, None])
        ids = batch.input_ids.reshape(-1)
        pos = batch.position_ids.reshape(-1)
        if flat is not None:
            ids, pos = ids[flat], pos[flat]
        n = len(ids)
        row_start = np.zeros(B + 1, np.int64)
        np.cumsum(lens, out=row_start[1:])
        gate = self._empty_f
        if self._has_adapter and batch.draft_gate.any():
            g = batch.draft_gate.reshape(-1)
            g = g if flat is None else g[flat]
            gate = torch.from_numpy(np.ascontiguousarray(g, np.float32))
        qscale = self._empty_f
        if self._q_beta:
            qs = 1.0 + self._q_beta * np.log1p(np.floor(pos.astype(np.float32) / self._q_period))
            qscale = torch.from_numpy(qs.astype(np.float32))
        out_rows = (row_start[1:] - 1) if batch.last_only else np.arange(n, dtype=np.int64)
        want = bool(np.any(batch.want_logits))
        res = self._impl.forward(
            torch.from_numpy(np.ascontiguousarray(ids, np.int64)), torch.from_numpy(np.ascontiguousarray(pos, np.int64)),
            torch.from_numpy(row_start), torch.from_numpy(np.ascontiguousarray(batch.past_lens, np.int64)),
            torch.from_numpy(np.ascontiguousarray(batch.slots, np.int64)),
            torch.from_numpy(np.ascontiguousarray(batch.intra_mask, bool)), gate, qscale,
            torch.from_numpy(out_rows), bool(batch.write_kv), want)
        lse = res[3].numpy() if len(res) == 5 else None  # an older kernel (a benchmark's "before") has none
        arrays = [res[0].numpy(), res[1].numpy(), res[2].numpy(), res[-1].numpy() if want else None, lse]
        if batch.last_only:
            where = (np.arange(B), lens - 1)
        elif flat is None:
            return ForwardOutput(*[None if a is None else a.reshape(B, T, *a.shape[1:]) for a in arrays])
        else:
            where = np.unravel_index(flat, (B, T))
        return ForwardOutput(*[None if a is None else _scatter(a, where, B, T) for a in arrays])

    def copy_slot(self, src: int, dst: int, length: int) -> None:
        self._impl.copy_slot(int(src), int(dst), int(length))


def _scatter(a: np.ndarray, where, B: int, T: int) -> np.ndarray:
    out = np.zeros((B, T) + a.shape[1:], a.dtype)
    out[where] = a
    return out
