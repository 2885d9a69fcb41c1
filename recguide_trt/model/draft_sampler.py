"""The draft sampler: picks each greedy draft token among the draft forward's top candidates, knowing the
token drafted before it.

A masked-diffusion draft predicts a block's positions in one forward, each without knowing what the
position before it chose: where two continuations compete, position j may follow one and position j+1
the other, or repeat the token before it (one in five or six of SmolLM2's rejected draft tokens at block 8
repeats the previous one). The sampler rescores position j's candidates ``c`` (the backend's top ids, MASK
excluded) as

    log p_j(c) + δ(t_{j-1}, j) · W_head[c] + r_j · [c = t_{j-1}]

where ``t_{j-1}`` is the token drafted at j-1, ``δ`` a small MLP of that token's (normalised) input
embedding plus a learned vector for the offset j, and ``r_j`` a learned weight on repeating it. It
runs on the host, from the outputs every backend already returns (three candidates from the native and
torch backends, two from an exported graph). It changes which tokens are drafted, never how they are verified, so every
policy's output stays AR's token for token; it only moves acceptance. It is trained after the draft
adapter on the same targets (:mod:`recguide_trt.training.sampler`, which holds the same formula in torch)
and ships in the adapter's directory (``draft_sampler.safetensors``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

FIRST_POSITION = 2
"""The block position of the sampler's first offset: d1 is the seed's exact AR token (``draft_seed_causal``),
so d2 is the first token a sampler can choose."""
EPS = 1e-5


@dataclass
class DraftSamplerWeights:
    """The sampler's parameters, float32 (shapes with D = hidden size, F = its MLP width, P = offsets)."""

    offset: np.ndarray
    """``[P, D]``: added to the previous token's normalised embedding; row i is block position 2 + i (the
    last row serves every position after it)."""
    up_weight: np.ndarray
    """``[F, D]``."""
    up_bias: np.ndarray
    """``[F]``."""
    down_weight: np.ndarray
    """``[D, F]``: δ = down(silu(up(x)))."""
    down_bias: np.ndarray
    """``[D]``."""
    repeat: np.ndarray
    """``[P]``: the score added to a candidate equal to the previous token, per offset."""

    def check(self, hidden_size: int, where: str) -> None:
        P, D = self.offset.shape
        F = self.up_weight.shape[0]
        want = {"offset": (P, hidden_size), "up_weight": (F, hidden_size), "up_bias": (F,),
                "down_weight": (hidden_size, F), "down_bias": (hidden_size,), "repeat": (P,)}
        for name, shape in want.items():
            got = tuple(getattr(self, name).shape)
            if got != shape:
                raise ValueError(f"{where}: draft sampler tensor {name} has shape {got}, expected {shape} "
                                 f"(the model's hidden size is {hidden_size})")


class DraftSampler:
    """Chooses greedy draft tokens (see the module's docstring).

    ``embed_rows(ids)`` / ``head_rows(ids)``: the model's input-embedding and output-head rows of ``ids``
    as float32 ``[n, D]`` arrays (the caller reads them from the weights the backend already holds);
    ``vocab_size``: the rows there are.

    The MLP's two D-wide products are folded into per-token tables once, at load: ``up(LN(E[t]))`` and
    ``W_head[c] · down``, F numbers per token each (F = the MLP's width; 2 × 12.6 MB for SmolLM2 at F = 64).
    A block's scores are then gathers and F-wide sums: the two 576-wide GEMMs per row cost about ten times
    more on the host (ad hoc timing, Zen 3, one thread: 0.55 ms a block of 8 against 0.09; the tables take 0.6 s).
    """

    CHUNK = 4096
    """Tokens per piece of the tables' computation (bounds its float32 temporaries)."""

    def __init__(self, weights: DraftSamplerWeights, embed_rows: Callable[[np.ndarray], np.ndarray],
                 head_rows: Callable[[np.ndarray], np.ndarray], vocab_size: int):
        w = self.w = weights
        up, head_down, head_bias = [], [], []
        for a in range(0, vocab_size, self.CHUNK):
            ids = np.arange(a, min(vocab_size, a + self.CHUNK))
            e = np.asarray(embed_rows(ids), np.float32)
            e = (e - e.mean(-1, keepdims=True)) / np.sqrt(e.var(-1, keepdims=True) + EPS)
            up.append(e @ w.up_weight.T)
            h = np.asarray(head_rows(ids), np.float32)
            head_down.append(h @ w.down_weight)
            head_bias.append(h @ w.down_bias)
        self.up = np.concatenate(up)
        """``[V, F]``: up_weight · LN(E[t]) per token t."""
        self.head_down = np.concatenate(head_down)
        """``[V, F]``: W_head[c] · down_weight per candidate c."""
        self.head_bias = np.concatenate(head_bias)
        """``[V]``: W_head[c] · down_bias."""
        self.offset_up = w.offset @ w.up_weight.T + w.up_bias
        """``[P, F]``: up_weight · offset_j + up_bias."""

    def scores(self, prev: np.ndarray, offsets: np.ndarray, cand: np.ndarray, log_probs: np.ndarray) -> np.ndarray:
        """Scores ``[n, k]`` of candidates ``cand`` ``[n, k]`` whose draft log-probabilities are ``log_probs``,
        each row after previous token ``prev[i]`` at sampler offset ``offsets[i]`` (clamped to the last)."""
        off = np.minimum(offsets, len(self.offset_up) - 1)
        u = self.up[prev] + self.offset_up[off]
        with np.errstate(over="ignore"):  # exp(-u) of a very negative u is inf, and u / inf the right 0
            u = u / (1.0 + np.exp(-u))  # silu
        rep = self.w.repeat[off][:, None] * (cand == prev[:, None])
        return log_probs + np.einsum("nf,nkf->nk", u, self.head_down[cand]) + self.head_bias[cand] + rep

    def choose(self, prev: int, top_ids: np.ndarray, top_probs: np.ndarray, first_offset: int = 0) -> list[int]:
        """Tokens for consecutive draft positions, each after the one chosen before it: ``prev`` is the token
        before the first; ``top_ids`` ``[n, >=k]`` and ``top_probs`` ``[n, k]`` are the positions' candidates
        and their draft probabilities (k = 2 or 3: the candidates the backend scored); ``first_offset``
        is the first position's offset (block position 2 + offset)."""
        return self.choose_scored(prev, top_ids, top_probs, first_offset)[0]

    def choose_scored(self, prev: int, top_ids: np.ndarray, top_probs: np.ndarray,
                      first_offset: int = 0) -> tuple[list[int], np.ndarray]:
        """:meth:`choose`'s tokens, and ``[n, k]`` probabilities of each position's candidates after the token
        chosen before it: the softmax of their scores, times the draft mass the k candidates hold. What a
        prospective bet should weigh: verification reaches position i only if every token before it was
        accepted, so i's previous token is then the one drafted (the sampler's features are what it was trained on).

        Position i's previous token is one of position i-1's k candidates, so every (previous token, position)
        pair that can occur is scored in one batch (1 + k·(n-1) rows: a few array operations per block, not
        per position), and the walk from the first position on only reads the chosen rows."""
        k = top_probs.shape[-1]
        cand = np.asarray(top_ids[:, :k], np.int64)
        n = cand.shape[0]
        if n == 0:
            return [], np.zeros((0, k), np.float64)
        probs = np.asarray(top_probs, np.float32)
        logp = np.log(np.maximum(probs, 1e-30))
        prevs = np.concatenate([[prev], cand[:-1].reshape(-1)])  # row 1 + i·k + c: position i's candidate c
        at = np.concatenate([[0], np.repeat(np.arange(1, n), k)])  # the position each row's token precedes
        s = self.scores(prevs, first_offset + at, cand[at], logp[at])
        out: list[int] = []
        used = np.empty(n, np.int64)
        row = 0
        for i in range(n):
            used[i] = row
            c = int(s[row].argmax())
            out.append(int(cand[i, c]))
            row = 1 + i * k + c
        z = s[used].astype(np.float64)
        z = np.exp(z - z.max(-1, keepdims=True))
        return out, z / z.sum(-1, keepdims=True) * probs.astype(np.float64).sum(-1, keepdims=True)


def sampler_weights_from(tensors: dict[str, np.ndarray], where: str) -> DraftSamplerWeights:
    """:class:`DraftSamplerWeights` from a file's tensors (names as the fields), float32; names what is missing."""
    missing = [f for f in DraftSamplerWeights.__dataclass_fields__ if f not in tensors]
    if missing:
        raise ValueError(f"{where}: draft sampler tensors missing: {', '.join(missing)}")
    return DraftSamplerWeights(**{f: np.ascontiguousarray(tensors[f], np.float32)
                                  for f in DraftSamplerWeights.__dataclass_fields__})
