"""The backend interface: one packed forward in, small numpy arrays out.

Backends own the model weights and the KV cache storage; they never make policy decisions.
Everything crossing this boundary is numpy, so the runtime and the policies stay framework-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

TOPK = 3
"""Draft candidates returned per position: top-1 (the draft), top-2/top-3 (correction candidates)."""


@dataclass
class ForwardBatch:
    """One packed forward over B requests (rows), T new tokens each (right-padded)."""

    slots: np.ndarray
    """``[B]`` int64: KV-cache slot of each row."""
    past_lens: np.ndarray
    """``[B]`` int64: committed (cached) tokens of each row; new tokens are written after them."""
    input_ids: np.ndarray
    """``[B, T]`` int64 token ids (padding: any id)."""
    position_ids: np.ndarray
    """``[B, T]`` int64 rotary positions."""
    intra_mask: np.ndarray
    """``[B, T, T]`` bool: which new tokens each new token sees (the cached prefix is always seen)."""
    draft_gate: np.ndarray
    """``[B, T]`` float32: 1 on draft-mode tokens (draft adapter on), 0 elsewhere."""
    want_logits: np.ndarray
    """``[B]`` bool: rows whose full logits must be returned (sampling); greedy rows need none."""
    write_kv: bool = True
    """Write the new tokens' K/V into the cache. False for a forward that runs concurrently with
    another one on the same slots (the prospective draft of ``overlap="streams"``)."""
    row_lens: np.ndarray | None = None
    """``[B]`` int64: real (unpadded) tokens of each row; None = all ``T``. A backend may run its
    token-wise layers on these tokens only; outputs at padding positions are then unspecified."""
    last_only: bool = False
    """Only each row's last real token's outputs are read (a prefill): a backend may run the head
    there only; outputs at the other positions are then unspecified."""

    @property
    def shape(self) -> tuple[int, int]:
        return self.input_ids.shape  # type: ignore[return-value]

    def validate(self, max_slots: int, slot_capacity: int, vocab_size: int | None = None) -> int:
        """Check shapes, slot ids, past lengths, cache capacity and, given ``vocab_size``, that every input id
        is in the vocabulary (ValueError naming the problem; an id past the embedding table would read other
        memory in the native kernel and fail deep inside torch's embedding elsewhere).

        Returns the longest past length P of the batch.
        """
        B, T = self.input_ids.shape
        for name, arr, shape in (("position_ids", self.position_ids, (B, T)), ("intra_mask", self.intra_mask, (B, T, T)),
                                 ("draft_gate", self.draft_gate, (B, T)), ("slots", self.slots, (B,)),
                                 ("past_lens", self.past_lens, (B,)), ("want_logits", self.want_logits, (B,))):
            if tuple(np.shape(arr)) != shape:
                raise ValueError(f"{name} has shape {tuple(np.shape(arr))}, expected {shape}")
        if self.row_lens is not None:
            lens = np.asarray(self.row_lens)
            if lens.shape != (B,):
                raise ValueError(f"row_lens has shape {lens.shape}, expected {(B,)}")
            if B and (lens.min() < 1 or lens.max() > T):
                raise ValueError(f"row_lens must be in [1, {T}], got {lens.tolist()}")
        slots, past_lens = np.asarray(self.slots), np.asarray(self.past_lens)
        if B and (slots.min() < 0 or slots.max() >= max_slots):
            raise ValueError(f"slot ids must be in [0, {max_slots}), got {slots.tolist()}")
        if B and past_lens.min() < 0:
            raise ValueError(f"past_lens must be >= 0, got {past_lens.tolist()}")
        ids = np.asarray(self.input_ids)
        if vocab_size is not None and ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
            raise ValueError(f"input_ids must be in [0, {vocab_size}) (the vocabulary), got "
                             f"{int(ids.min())}..{int(ids.max())}")
        P = int(past_lens.max(initial=0))
        if P + T > slot_capacity:
            raise ValueError(f"forward needs {P + T} cache positions, slot capacity is {slot_capacity}")
        return P


@dataclass
class ForwardOutput:
    """What acceptance and mismatch prediction need; full logits only where asked for."""

    argmax: np.ndarray
    """``[B, T]`` int64: plain argmax over the whole vocabulary (AR / verify predictions)."""
    top_ids: np.ndarray
    """``[B, T, TOPK]`` int64: best ids with the MASK token excluded (draft candidates)."""
    top_probs: np.ndarray
    """``[B, T, k]`` float32: softmax probabilities (MASK excluded) of the first k of ``top_ids``: k = 3 on
    the native and torch backends, 2 from an exported graph (ONNX Runtime, TensorRT) and the simulator."""
    logits: np.ndarray | None = None
    """``[B, T, V]`` float32 when any row of the batch wanted logits, else None."""
    lse: np.ndarray | None = None
    """``[B, T]`` float32: log Σ exp of each position's logits over the whole vocabulary, where the backend
    computes it with them (the native backend); else None, and log-probabilities sum on the host."""


class Backend(Protocol):
    """Runs packed forwards of one model and keeps its KV cache.

    A backend may use ``ForwardBatch.row_lens`` to skip padding (the torch backend does) or run
    the rows padded (the ONNX Runtime and TensorRT graphs); the outputs at real positions agree.
    One that packs the rows for the whole forward, attention included, says so with a class
    attribute ``packs_rows = True`` (the native backend): its step costs what its real tokens cost,
    which the cost refit uses (``runtime.engine``).

    A slot's K/V at positions below a request's committed length stays valid after the request ends,
    and ``copy_slot`` carries it to another slot: the engine's prefix cache relies on both. A backend that
    keeps no real K/V (the simulator's) says ``kv_reusable = False``.
    One whose attention reads each row's slot in place, with no gather into a dense batch, says
    ``reads_slots_in_place = True``; the engine then leaves running requests where they are instead of
    moving them into slots 0 … n-1.
    """

    name: str
    max_slots: int
    slot_capacity: int
    vocab_size: int

    def forward(self, batch: ForwardBatch) -> ForwardOutput:
        """Run the model; write the new tokens' K/V at ``[past_len, past_len + T)`` of each slot.

        Writing every new token is safe: the runtime's committed length decides what is valid,
        so rejected or draft-mode K/V beyond it are overwritten by the next forward.
        """
        ...

    def launch(self, batch: ForwardBatch, stream=None):
        """Enqueue the forward (on ``stream`` where the backend has streams); return a pending handle."""
        ...

    def collect(self, pending) -> ForwardOutput:
        """Wait for a launched forward and return its outputs. ``forward = collect(launch(batch))``."""
        ...

    def copy_slot(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` cached tokens of slot ``src`` to slot ``dst``."""
        ...
