"""A deterministic stand-in model for fast, high-acceptance runtime tests.

The "true" next token after token t at position p is ``g(t, p)``. AR/verify positions predict
exactly that. A MASK position predicts the token at its own position by chaining ``g`` from the
latest visible real token of its row, but the draft is wrong at some positions (then the right
token is usually rank 2, with a small margin, like real draft logits). So AR greedy output is known
in closed form, drafts are often but not always accepted, and fused/prospective rows can hit.
"""

from __future__ import annotations

import numpy as np

from recguide_trt.backends.base import ForwardBatch, ForwardOutput

V = 64
MASK = 3
EOS = 2


def g(t: int, p: int) -> int:
    v = (t * 31 + p * 7 + 5) % 101
    return EOS if v == 0 else 4 + v % (V - 4)


def reference(prompt: list[int], max_tokens: int) -> list[int]:
    out, t, p = [], prompt[-1], len(prompt) - 1
    while len(out) < max_tokens:
        t = g(t, p)
        p += 1
        out.append(t)
        if t == EOS:
            break
    return out


def corrupt(p: int) -> int:
    """0: draft right; 1: wrong, right token is rank 2; 2: wrong, right token is rank 3."""
    h = (p * 2654435761) % 97
    return 1 if h % 4 == 0 else (2 if h % 11 == 0 else 0)


class FakeBackend:
    name = "fake"
    vocab_size = V
    mask_token_id = MASK

    def __init__(self, max_slots: int = 64, slot_capacity: int = 4096):
        self.max_slots = max_slots
        self.slot_capacity = slot_capacity
        self.forwards = 0
        self.shapes: list[tuple[int, int]] = []

    def forward(self, batch: ForwardBatch) -> ForwardOutput:
        self.forwards += 1
        B, T = batch.input_ids.shape
        self.shapes.append((B, T))
        argmax = np.zeros((B, T), np.int64)
        top = np.zeros((B, T, 3), np.int64)
        probs = np.zeros((B, T, 2), np.float32)
        for b in range(B):
            ids, pos, m = batch.input_ids[b], batch.position_ids[b], batch.intra_mask[b]
            for i in range(T):
                if ids[i] != MASK:
                    nxt = g(int(ids[i]), int(pos[i]))
                    argmax[b, i] = nxt
                    top[b, i] = [nxt, (nxt + 1) % V or 4, (nxt + 2) % V or 4]
                    probs[b, i] = (0.9, 0.05)
                    continue
                seen = [j for j in range(T) if m[i, j] and ids[j] != MASK and pos[j] < pos[i]]
                j = max(seen, key=lambda k: pos[k])
                x = int(ids[j])
                for q in range(int(pos[j]), int(pos[i])):
                    x = g(x, q)
                wrong = 4 + (x * 5 + 1) % (V - 4)
                if wrong == x:
                    wrong = 4 + (wrong - 3) % (V - 4)
                other = 4 + (x * 11 + 3) % (V - 4)
                if other in (x, wrong):
                    other = 4 + (other - 2) % (V - 4) if 4 + (other - 2) % (V - 4) not in (x, wrong) else 5
                kind = corrupt(int(pos[i]))
                if kind == 0:
                    top[b, i] = [x, wrong, other]
                    probs[b, i] = (0.8, 0.1) if pos[i] % 3 else (0.4, 0.35)  # some risky-but-right
                elif kind == 1:
                    top[b, i] = [wrong, x, other]
                    probs[b, i] = (0.45, 0.4)
                else:
                    top[b, i] = [wrong, other, x]
                    probs[b, i] = (0.5, 0.3)
                argmax[b, i] = top[b, i, 0]
        logits = None
        if batch.want_logits.any():
            logits = np.full((B, T, V), -10.0, np.float32)
            for b in range(B):
                for i in range(T):
                    logits[b, i, top[b, i, 0]] = 2.0
                    logits[b, i, top[b, i, 1]] = 1.5
        return ForwardOutput(argmax=argmax, top_ids=top, top_probs=probs, logits=logits)

    def copy_slot(self, src: int, dst: int, length: int) -> None:
        pass
