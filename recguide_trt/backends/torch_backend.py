"""Reference backend: the PyTorch backbone, eager, on CPU or CUDA."""

from __future__ import annotations

import numpy as np
import torch

from ..model.backbone import NLDModel
from .base import TOPK, ForwardBatch, ForwardOutput


class TorchBackend:
    """Runs :class:`NLDModel` on packed batches; KV cache per layer ``[slots, n_kv, capacity, hd]``.

    Rows shorter than the batch's longest cost only their own tokens in the token-wise layers
    (``ForwardBatch.row_lens``, :class:`~recguide_trt.model.backbone.Packing`).
    """

    name = "torch"

    def __init__(self, model: NLDModel, max_slots: int, slot_capacity: int, device: str | torch.device = "cpu"):
        self.model = model
        cfg = model.config
        self.config = cfg
        self.device = torch.device(device)
        self.dtype = next(model.parameters()).dtype
        self.max_slots = max_slots
        self.slot_capacity = slot_capacity
        self.vocab_size = cfg.vocab_size
        self.mask_token_id = cfg.mask_token_id
        shape = (max_slots, cfg.num_key_value_heads, slot_capacity, cfg.head_dim)
        # Zeroed, not empty: masked cache positions get probability 0, and 0 × NaN from stray
        # uninitialised memory would still poison a row.
        self.k_cache = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(cfg.num_hidden_layers)]
        self.v_cache = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(cfg.num_hidden_layers)]

    def _tensor(self, a: np.ndarray, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(self.device, dtype=dtype)

    def forward(self, batch: ForwardBatch) -> ForwardOutput:
        return self.collect(self.launch(batch))

    @torch.inference_mode()
    def launch(self, batch: ForwardBatch, stream: torch.cuda.Stream | None = None):
        """Enqueue the forward (on ``stream`` on CUDA); outputs stay on the device until collect."""
        if stream is not None:
            with torch.cuda.stream(stream):
                return self._launch(batch), stream
        return self._launch(batch), None

    def collect(self, pending) -> ForwardOutput:
        (logits, want_logits, real), stream = pending
        if stream is not None:
            with torch.cuda.stream(stream):
                return self._reduce(logits, want_logits, real)
        return self._reduce(logits, want_logits, real)

    @torch.inference_mode()
    def _launch(self, batch: ForwardBatch):
        B, T = batch.input_ids.shape
        P = batch.validate(self.max_slots, self.slot_capacity, self.vocab_size)
        past_lens = batch.past_lens.astype(np.int64)
        slots = batch.slots.astype(np.int64)
        contiguous = bool(np.array_equal(slots, np.arange(B)))
        slot_t = self._tensor(slots)
        past = None
        if P > 0:
            if contiguous:
                past = [(k[:B, :, :P], v[:B, :, :P]) for k, v in zip(self.k_cache, self.v_cache)]
            else:
                past = [(k[:, :, :P].index_select(0, slot_t), v[:, :, :P].index_select(0, slot_t))
                        for k, v in zip(self.k_cache, self.v_cache)]
        past_valid = np.arange(P)[None, :] < past_lens[:, None]
        mask = np.concatenate([np.broadcast_to(past_valid[:, None, :], (B, T, P)), batch.intra_mask], axis=-1)
        # No draft token in the batch (AR, verify, prefill): skip the adapter's matmuls entirely, so a
        # disabled speculation costs nothing (gate 0 would multiply their output by zero).
        gate = self._tensor(batch.draft_gate, self.dtype) if batch.draft_gate.any() else None
        real = None  # [B, T] bool of real tokens when the forward skips padding
        token_index = None
        if batch.row_lens is not None and int(np.sum(batch.row_lens)) < B * T:
            real = np.arange(T)[None, :] < np.asarray(batch.row_lens)[:, None]
            token_index = self._tensor(np.flatnonzero(real))
        logits, present = self.model(
            self._tensor(batch.input_ids, torch.long), self._tensor(batch.position_ids, torch.long),
            self._tensor(mask), past, gate, token_index=token_index)
        if batch.write_kv:
            write_pos = self._tensor(past_lens[:, None] + np.arange(T)[None, :])
            for (k, v), kc, vc in zip(present, self.k_cache, self.v_cache):
                kc[slot_t[:, None], :, write_pos] = k.transpose(1, 2)
                vc[slot_t[:, None], :, write_pos] = v.transpose(1, 2)
        return logits, batch.want_logits, real

    @torch.inference_mode()
    def _reduce(self, logits: torch.Tensor, want_logits: np.ndarray, real: np.ndarray | None) -> ForwardOutput:
        logits = logits.float()
        argmax = logits.argmax(-1)
        masked = logits.clone()
        masked[..., self.mask_token_id] = float("-inf")
        top_vals, top_ids = masked.topk(TOPK, dim=-1)
        lse = torch.logsumexp(masked, dim=-1, keepdim=True)
        top_probs = (top_vals - lse).exp()
        arrays = [argmax.cpu().numpy(), top_ids.cpu().numpy(), top_probs.cpu().numpy(),
                  logits.cpu().numpy() if bool(np.any(want_logits)) else None]
        if real is not None:  # packed [N, ...] -> the batch's [B, T, ...], zeros at padding
            arrays = [None if a is None else _unpack(a, real) for a in arrays]
        return ForwardOutput(argmax=arrays[0], top_ids=arrays[1], top_probs=arrays[2], logits=arrays[3])

    @torch.inference_mode()
    def copy_slot(self, src: int, dst: int, length: int) -> None:
        for kc, vc in zip(self.k_cache, self.v_cache):
            kc[dst, :, :length] = kc[src, :, :length]
            vc[dst, :, :length] = vc[src, :, :length]


def _unpack(packed: np.ndarray, real: np.ndarray) -> np.ndarray:
    out = np.zeros(real.shape + packed.shape[1:], packed.dtype)
    out[real] = packed
    return out
