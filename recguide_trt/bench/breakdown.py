"""Where a decode step's time goes: host phases of the engine and the backend's own split.

For one backend, policy and concurrency C: C requests are prefilled, every timer is reset, and
the decode steps run to the end. The engine's phase timers (``Engine.phase_times``) give the host
work (schedule, plan, pack, accept, emit, retire); the backend's forward is split by what that
backend can tell:

* ``native``: its own per-phase timers inside the C++ forward (attention, projections, MLP,
  draft adapter, norms, head, head reduction); the rest of its forward call is Python-side
  conversion.
* ``torch``: module hooks (attention core = attention module minus its projections; projections;
  MLP; norms; head), the backend's mask building / KV write / tensor conversion (its launch minus
  the model) and its output reduction (argmax, top-k, probabilities).
* ``onnxruntime``: ONNX Runtime's own node profile for the graph (nodes by their module path),
  and the feed building with the past-KV copies in and the present-KV copies out around it.

Each row: milliseconds per decode step by category, and output tokens per second.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

CATEGORIES = ("host: engine", "host: backend conversion", "attention", "projections + MLP", "norms",
              "head", "head reduce", "other")
"""Columns of the table, in order (``host: engine`` = scheduling, planning, packing and mask rows,
acceptance, streaming and retiring; ``host: backend conversion`` = what a backend does around its
model: numpy↔tensor, masks over the past, KV-cache copies)."""


@dataclass
class Breakdown:
    backend: str
    policy: str
    concurrency: int
    steps: int
    tokens: int
    seconds: float
    """Wall time of the decode steps."""
    ms_per_step: dict[str, float] = field(default_factory=dict)
    """Milliseconds per decode step, by :data:`CATEGORIES`."""
    forwards: dict[str, int] = field(default_factory=dict)
    """Decode forwards by kind (ar, draft, verify, fused)."""

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


# -- backend instrumentation -----------------------------------------------------------------
class _TorchProbe:
    """Times the torch backend's modules with forward hooks (CPU: wall time is the op time)."""

    def __init__(self, backend):
        from ..model.backbone import MLP, Attention, GatedLinear, RMSNorm

        self.backend, self.acc, self._t0, self._handles = backend, Counter(), {}, []
        model = backend.model
        kinds = [(Attention, "attn_total"), (GatedLinear, "attn_proj"), (MLP, "mlp"), (RMSNorm, "norm")]
        for mod in model.modules():
            for cls, key in kinds:
                if isinstance(mod, cls):
                    if cls is GatedLinear and "mlp" in _path(model, mod):
                        continue  # inside the MLP's own time
                    self._hook(mod, key)
        self._hook(model.diffusion_head, "head")
        self._hook(model, "model")
        self._orig = backend._launch, backend._reduce

        def launch(batch):
            t = time.perf_counter()
            try:
                return self._orig[0](batch)
            finally:
                self.acc["launch"] += time.perf_counter() - t

        def reduce(*a):
            t = time.perf_counter()
            try:
                return self._orig[1](*a)
            finally:
                self.acc["reduce"] += time.perf_counter() - t

        backend._launch, backend._reduce = launch, reduce

    def _hook(self, mod, key):
        def pre(m, args):
            self._t0[id(m)] = time.perf_counter()

        def post(m, args, out):
            self.acc[key] += time.perf_counter() - self._t0.pop(id(m))

        self._handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]

    def reset(self):
        self.acc.clear()

    def split(self, forward_s: float) -> dict[str, float]:
        a = self.acc
        norms = a["norm"]
        attention = a["attn_total"] - a["attn_proj"]
        proj = a["attn_proj"] + a["mlp"]
        model_other = a["model"] - a["attn_total"] - a["mlp"] - norms - a["head"]  # embed, RoPE, residuals
        return {"attention": attention, "projections + MLP": proj, "norms": norms, "head": a["head"],
                "head reduce": a["reduce"], "host: backend conversion": a["launch"] - a["model"],
                "other": model_other + max(0.0, forward_s - a["launch"] - a["reduce"])}

    def close(self):
        for h in self._handles:
            h.remove()
        self.backend._launch, self.backend._reduce = self._orig


def _path(model, mod) -> str:
    for name, m in model.named_modules():
        if m is mod:
            return name
    return ""


class _NativeProbe:
    def __init__(self, backend):
        self.backend = backend

    def reset(self):
        self.backend.set_timing(True)

    def split(self, forward_s: float) -> dict[str, float]:
        t = self.backend.timings()
        inner = sum(t.values())
        return {"attention": t["attention"], "norms": t["norm_embed"],
                "projections + MLP": t["qkv_proj"] + t["o_proj"] + t["mlp"],
                "head": t["head"], "head reduce": t["head_reduce"], "other": t["rope_kv_write"],
                "host: backend conversion": max(0.0, forward_s - inner)}

    def close(self):
        self.backend.set_timing(False)


class _OrtProbe:
    """Swaps in a profiling session (same graph) and splits its node events by module path."""

    def __init__(self, backend, workdir: Path):
        import onnxruntime as ort

        self.backend, self.workdir = backend, workdir
        self._orig = backend.session
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.intra_op_num_threads = self._orig.get_session_options().intra_op_num_threads
        opts.enable_profiling = True
        opts.profile_file_prefix = str(workdir / "ort_profile")
        self.session = ort.InferenceSession(str(backend.export_dir / backend.manifest.onnx_file), sess_options=opts,
                                            providers=backend.providers)
        self.run_s = 0.0
        outer = self

        class Timed:
            def run(self, names, feed):
                t = time.perf_counter()
                try:
                    return outer.session.run(names, feed)
                finally:
                    outer.run_s += time.perf_counter() - t

            def __getattr__(self, item):
                return getattr(outer.session, item)

        backend.session = Timed()
        self._start_us = 0.0

    def reset(self):
        self.run_s = 0.0
        self._start_us = time.perf_counter()

    def split(self, forward_s: float) -> dict[str, float]:
        path = self.session.end_profiling()
        events = json.loads(Path(path).read_text())
        roles = _graph_roles(self.backend.export_dir / self.backend.manifest.onnx_file, self.backend.vocab_size)
        node = Counter()
        for e in events:
            if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
                continue
            name = e["name"][: -len("_kernel_time")]
            node[_ort_category(name, e.get("args", {}).get("op_name", ""), roles)] += e["dur"] * 1e-6
        # The profiling session was made after the prefill: its node events are the measured steps'.
        # What session.run spends outside its nodes (binding the fed arrays, allocating outputs) is
        # "other".
        out = dict(node)
        out["other"] = out.get("other", 0.0) + max(0.0, self.run_s - sum(node.values()))
        out["host: backend conversion"] = max(0.0, forward_s - self.run_s)
        return out

    def close(self):
        self.backend.session = self._orig


def _graph_roles(onnx_path: Path, vocab: int) -> dict[str, str]:
    """Category of each node of the exported graph (the exporter's names say little: node_linear_7)."""
    import onnx

    g = onnx.load(str(onnx_path), load_external_data=False).graph
    weights = {i.name: tuple(i.dims) for i in g.initializer}
    roles = {}
    for n in g.node:
        w = [weights[x] for x in n.input if x in weights]
        if n.op_type in ("MatMul", "Gemm"):
            roles[n.name] = ("head" if any(vocab in d for d in w) else "projections + MLP") if w else "attention"
        elif n.op_type in ("Softmax", "Where"):
            roles[n.name] = "attention"
        elif n.op_type in ("ReduceMean", "Pow", "Sqrt", "Reciprocal"):
            roles[n.name] = "norms"
        elif n.op_type in ("TopK", "ArgMax", "ReduceMax", "ReduceSum", "Exp", "Log", "ReduceLogSumExp") or \
                n.domain.startswith("recguide"):
            roles[n.name] = "head reduce"
    return roles


def _ort_category(name: str, op: str, roles: dict[str, str]) -> str:
    if name in roles:
        return roles[name]
    if op in ("MatMul", "Gemm", "FusedMatMul", "MatMulNBits"):
        return "projections + MLP"
    if op in ("Softmax",):
        return "attention"
    if "LayerNormalization" in op:
        return "norms"
    if op in ("TopK", "ArgMax"):
        return "head reduce"
    return "other"


def probe_for(backend, workdir: Path):
    name = getattr(backend, "name", "")
    if name == "native":
        return _NativeProbe(backend)
    if name == "torch":
        return _TorchProbe(backend)
    if name == "onnxruntime":
        return _OrtProbe(backend, workdir)
    raise ValueError(f"no breakdown for backend {name!r}")


# -- one measurement ---------------------------------------------------------------------------
def measure(llm, policy: str, concurrency: int, prompts: list[list[int]], max_tokens: int, workdir: Path,
            block_size: int | None = None) -> Breakdown:
    """Decode steps of ``concurrency`` requests (prefill excluded) with every timer on."""
    from ..runtime.params import SamplingParams

    engine = llm.engine
    params = SamplingParams(max_tokens=max_tokens, policy=policy, block_size=block_size, stop_at_eos=False)
    reqs = [engine.submit(prompts[i % len(prompts)], params) for i in range(concurrency)]
    while any(r.seed is None and not r.done for r in reqs):  # admission + prefill, untimed
        engine.step()
    probe = probe_for(llm.backend, workdir)
    before = Counter(engine.phase_times)  # the engine's totals stay whole (time_forward, stats)
    probe.reset()
    steps0 = engine.steps
    out0 = sum(len(r.output_ids) for r in reqs)
    t0 = time.perf_counter()
    engine.run_until_done()
    seconds = time.perf_counter() - t0
    steps = engine.steps - steps0
    pt = Counter({k: v - before[k] for k, v in engine.phase_times.items()})
    split = probe.split(pt["forward"])
    probe.close()
    host = sum(pt[k] for k in ("schedule", "plan", "pack", "accept", "emit", "retire"))
    split["host: engine"] = host
    split["other"] = split.get("other", 0.0) + max(0.0, seconds - host - pt["forward"])
    forwards: Counter = Counter()
    for r in reqs:
        for kind, n in r.metrics.forwards.items():
            if kind != "prefill":
                forwards[kind] += n
    per_step = {k: 1e3 * split.get(k, 0.0) / max(steps, 1) for k in CATEGORIES}
    return Breakdown(getattr(llm.backend, "name", "?"), policy if block_size is None else f"{policy}-L{block_size}",
                     concurrency, steps, sum(len(r.output_ids) for r in reqs) - out0, seconds, per_step,
                     dict(forwards))


def table(rows: list[Breakdown]) -> str:
    head = ["backend", "policy", "C", "ms/step"] + list(CATEGORIES) + ["tok/s", "decode forwards"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * 3 + ["---:"] * (len(head) - 4) + ["---"]) + "|"]
    for r in rows:
        total = sum(r.ms_per_step.values())
        cells = [r.backend, r.policy, str(r.concurrency), f"{total:.3f}"]
        cells += [f"{r.ms_per_step[c]:.3f}" for c in CATEGORIES]
        cells += [f"{r.tok_s:.0f}", ", ".join(f"{k} {v}" for k, v in sorted(r.forwards.items()))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def shares(rows: list[Breakdown]) -> str:
    """The same rows as percentages of the step (what a reader compares across backends)."""
    head = ["backend", "policy", "C"] + list(CATEGORIES)
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * 3 + ["---:"] * len(CATEGORIES)) + "|"]
    for r in rows:
        total = sum(r.ms_per_step.values()) or 1.0
        lines.append("| " + " | ".join([r.backend, r.policy, str(r.concurrency)] +
                                       [f"{100 * r.ms_per_step[c] / total:.0f} %" for c in CATEGORIES]) + " |")
    return "\n".join(lines)
