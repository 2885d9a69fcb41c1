"""Our logit margin at each greedy divergence: a near-tie (rounding decides it) or a real mismatch.

For a divergence at token ``k`` of prompt ``i``, the context is the prompt plus the reference's
first ``k`` tokens (the engine produced the same ones); the margin is
``logit[ref token] - logit[engine's token]`` of our model's causal forward there, in fp32 and in
fp64. A margin of ~1e-3 or less means the two tokens tie to within float rounding.
"""

from __future__ import annotations

from pathlib import Path

MODES = ("serial", "batch")


def add_margins(results: dict, prompts: list[list[int]], model_dir: Path | None = None, limit: int = 64) -> int:
    """Fill ``divergence["margin"]`` in place for up to ``limit`` divergences; how many were measured."""
    ref = results.get("reference_outputs")
    divs = [d for r in results["rows"].values() for m in MODES for d in r[m].get("divergences", [])
            if d["ref"] is not None and d["got"] is not None]
    if ref is None or not divs:
        return 0
    import numpy as np
    import torch

    from recguide_trt.model import masks
    from recguide_trt.model.checkpoint import load_checkpoint
    from recguide_trt.models.names import EMBEDDED_MODEL

    m32 = load_checkpoint(model_dir or EMBEDDED_MODEL, dtype="float32", load_adapter=False).model
    m64 = load_checkpoint(model_dir or EMBEDDED_MODEL, dtype="float32", load_adapter=False).model.double()
    cache: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def last_logits(model, ids: list[int]) -> torch.Tensor:
        T = len(ids)
        with torch.inference_mode():
            out, _ = model(torch.tensor([ids]), torch.arange(T)[None], torch.from_numpy(np.asarray(masks.causal(T)))[None])
        return out[0, -1]

    for d in divs[:limit]:
        key = (d["prompt"], d["pos"])
        if key not in cache:
            ctx = prompts[d["prompt"]] + ref[d["prompt"]][:d["pos"]]
            cache[key] = (last_logits(m32, ctx), last_logits(m64, ctx))
        l32, l64 = cache[key]
        d["margin"] = {"fp32": float(l32[d["ref"]] - l32[d["got"]]), "fp64": float(l64[d["ref"]] - l64[d["got"]])}
    return min(len(divs), limit)
