"""Llama 3.x rope scaling in a GGUF file.

``convert_hf_to_gguf.py`` writes a Llama 3.1 / 3.2 checkpoint's ``rope_scaling`` ({"rope_type": "llama3", factor,
low_freq_factor, high_freq_factor, original_max_position_embeddings}) as no metadata at all, but as a tensor
``rope_freqs.weight``: one float32 factor per rotary frequency, which llama.cpp divides each frequency by. The factors
are a function of the four parameters, and of the two frequency bounds only through their ratios, so the parameters
are recovered here from the factors (the common ones first, else a fit) and checked by recomputing the factors: the
imported model then runs our ``llama3`` rope, which equals transformers' on the model's Hugging Face directory.
"""

from __future__ import annotations

import math

import numpy as np

COMMON = ((8192, 1.0, 4.0),)
"""(original_max_position_embeddings, low_freq_factor, high_freq_factor) of Llama 3.1, 3.2 and 3.3."""
RTOL = 1e-5
"""How close recomputed factors must come to the stored float32 ones."""


def llama3_factors(theta: float, head_dim: int, factor: float, low: float, high: float, old: int) -> np.ndarray:
    """The ``rope_freqs`` factors ``convert_hf_to_gguf.py`` writes for these llama3 parameters, as it computes them."""
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)))
    out = []
    for freq in freqs.astype(np.float32):
        wavelen = 2 * math.pi / float(freq)
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def llama3_from_factors(factors: np.ndarray, theta: float, head_dim: int, where: str) -> dict:
    """The llama3 ``rope_parameters`` whose factors are ``factors`` (a ValueError naming ``where`` if none fit)."""
    f = np.asarray(factors, dtype=np.float32).reshape(-1)
    if f.shape[0] != head_dim // 2 or not np.all(np.isfinite(f)) or f.min() <= 0:
        raise ValueError(f"{where}: rope_freqs.weight holds {f.shape[0]} factors, expected {head_dim // 2} positive ones")
    factor = float(f.max())

    def params(old: int, low: float, high: float) -> dict | None:
        if not (0 < low < high and old > 0):
            return None
        if not np.allclose(llama3_factors(theta, head_dim, factor, low, high, old), f, rtol=RTOL, atol=0):
            return None
        return {"rope_type": "llama3", "rope_theta": theta, "factor": factor, "low_freq_factor": low,
                "high_freq_factor": high, "original_max_position_embeddings": old}

    for old, low, high in COMMON:
        if (p := params(old, low, high)) is not None:
            return p
    # A fit: inside the band, smooth = old / (high - low) / wavelen - low / (high - low), a line in 1 / wavelen. With
    # low = 1 (the bounds matter only through their ratios), its slope a and intercept -b give high and old.
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    band = (f > 1 + RTOL) & (f < factor * (1 - RTOL))
    if factor > 1 and band.sum() >= 2:
        smooth = (1 / f[band].astype(np.float64) - 1 / factor) / (1 - 1 / factor)
        a, minus_b = np.polyfit(freqs[band] / (2 * math.pi), smooth, 1)
        if minus_b < 0 and (p := params(round(a / -minus_b), 1.0, float(f"{1.0 + 1.0 / -minus_b:.6g}"))) is not None:
            return p
    raise ValueError(f"{where}: rope_freqs.weight (per-dimension rope factors, {f.min():.4g}..{factor:.4g}) matches no "
                     f"Llama 3 rope scaling; import the model's Hugging Face directory instead")
