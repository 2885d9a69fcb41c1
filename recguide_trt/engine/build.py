"""Build a TensorRT engine from an ONNX export (``model.onnx`` + ``manifest.json``).

    python -m recguide_trt.engine.build --onnx-dir DIR [--name NAME] [--precision fp16|bf16|fp32]
        [--plugin-lib PATH] [--timing-cache PATH] [--workspace-gb N] [--tau T] [--out-root DIR]

Steps (the manifest is the single source of truth for shapes and names):

1. :func:`rewrite_mismatch_for_plugin` - pure ``onnx`` graph surgery: the model-local function
   node ``recguide::MismatchPredict(logits, mismatch_tau)`` (int64 outputs) becomes the TensorRT
   plugin node ``MismatchPredict(logits, lengths)`` (``plugin_namespace`` "recguide", int32
   ``lengths`` = T for every row computed with Shape/Expand/Cast, ``tau`` a float attribute, int32
   outputs cast back to int64 under the original names); the function body is dropped so the
   ONNX parser imports the node from the plugin registry, and the now unused ``mismatch_tau``
   input is removed (the engine's tau is fixed at build time and recorded in ``engine.json``).
2. The plugin library (``librecguide_plugins.so``, plugins/CMakeLists.txt) is loaded into the
   plugin registry.
3. The ONNX parser reads the rewritten graph (external weights resolved next to ``model.onnx``).
4. One optimization profile per manifest profile (draft / verify / prefill), every dynamic input
   sized by :func:`profile_shapes`.
5. Precision flags (TensorRT 10: FP16/BF16 builder flags; TensorRT >= 11 is strongly typed, see
   :func:`apply_precision`), workspace limit, timing cache, a progress monitor.
6. Output: ``<out-root>/<name>/model.engine``, a copy of ``manifest.json`` and ``engine.json``
   (profile name -> engine profile index, engine I/O names, tau, precision, versions).

TensorRT is imported lazily: without it :func:`main` prints one line saying what to install and
returns 2.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from .manifest import MANIFEST_NAME, PROFILE_ORDER, ExportManifest

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = REPO_ROOT / "build" / "configs" / "default.json"
DEFAULT_OUT_ROOT = REPO_ROOT / "build" / "engines"
ENGINE_FILE = "model.engine"
ENGINE_INFO = "engine.json"
PLUGIN_NAMESPACE = "recguide"
PLUGIN_NAME = "MismatchPredict"
PLUGIN_VERSION = "1"
PLUGIN_LIBRARY = "librecguide_plugins.so"
PLUGIN_ATTRIBUTES = ("mask_token_id", "eos_token_id", "tau")
INSTALL_HINT = ("TensorRT is not installed: run `pip install .[trt]` (tensorrt + cuda-python) on a machine "
                "with an NVIDIA GPU and CUDA driver, or build inside NVIDIA's TensorRT / Triton NGC container")
BUILTIN_DEFAULTS: dict[str, Any] = {
    "precision": "fp16",
    "workspace_gb": 8,
    "tau": 0.5,
    "timing_cache": "build/timing.cache",
    "plugin_lib": None,
    "builder_optimization_level": 3,
    "out_root": "build/engines",
}
PRECISIONS = ("fp16", "bf16", "fp32")


# ------------------------------------------------------------------------------------------------
# Pure parts (testable without TensorRT)
# ------------------------------------------------------------------------------------------------
def load_build_config(path: str | Path | None = None) -> dict[str, Any]:
    """Build settings: built-in defaults overridden by ``build/configs/default.json`` (or ``path``)."""
    cfg = dict(BUILTIN_DEFAULTS)
    p = Path(path) if path is not None else DEFAULT_CONFIG
    if p.is_file():
        try:
            raw = json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{p}: not valid JSON ({exc})") from None
        unknown = set(raw) - set(BUILTIN_DEFAULTS) - {"comment"}
        if unknown:
            raise ValueError(f"{p}: unknown build setting(s) {', '.join(sorted(unknown))}")
        cfg.update({k: v for k, v in raw.items() if k != "comment"})
    elif path is not None:
        raise FileNotFoundError(f"build config {p} not found")
    if cfg["precision"] not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {cfg['precision']!r}")
    return cfg


def _dim_value(dim: int | str, batch: int, tokens: int, past: int) -> int:
    if isinstance(dim, int):
        return dim
    env = {"batch": batch, "tokens": tokens, "past": past, "past+tokens": past + tokens}
    if dim not in env:
        raise ValueError(f"unknown symbolic dimension {dim!r} in the manifest")
    return env[dim]


def profile_shapes(manifest: ExportManifest, profile: str,
                   inputs: list[str] | None = None) -> dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    """``{input name: (min shape, opt shape, max shape)}`` of every dynamic input for ``profile``.

    Symbolic dims come from the manifest's tensor specs: ``batch``, ``tokens``, ``past`` take the
    profile's ranges, ``past+tokens`` (the attention mask's key axis) their sums. Inputs without a
    symbolic dim (``mismatch_tau``) are left out; ``inputs`` restricts the result to those names
    (the engine's inputs after the plugin rewrite).
    """
    if profile not in manifest.profiles:
        raise ValueError(f"unknown profile {profile!r}; the manifest has {', '.join(manifest.profiles)}")
    prof = manifest.profiles[profile]
    out = {}
    for spec in manifest.inputs:
        if inputs is not None and spec.name not in inputs:
            continue
        if all(isinstance(d, int) for d in spec.shape):
            continue
        shapes = tuple(
            tuple(_dim_value(d, getattr(prof.batch, k), getattr(prof.tokens, k), getattr(prof.past, k))
                  for d in spec.shape)
            for k in ("min", "opt", "max"))
        out[spec.name] = shapes
    return out


def _mismatch_op_spec(manifest: ExportManifest) -> dict[str, Any]:
    for op in manifest.custom_ops:
        if op.get("op_type") == PLUGIN_NAME:
            return op
    return {"domain": PLUGIN_NAMESPACE, "op_type": PLUGIN_NAME, "inputs": ["logits", "mismatch_tau"],
            "outputs": ["top_ids", "top_probs", "flag_pos", "correction"],
            "attributes": {"mask_token_id": manifest.mask_token_id, "eos_token_id": manifest.eos_token_id}}


def rewrite_mismatch_for_plugin(model: Any, manifest: ExportManifest, tau: float = 0.5) -> Any:
    """Return a copy of ``model`` whose mismatch node is in the TensorRT plugin's form.

    Without a ``recguide::MismatchPredict`` node (export with ``--no-mismatch-op``) the copy is
    returned unchanged. Raises ValueError when the node does not look like the export's.
    """
    import onnx
    from onnx import TensorProto, helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    spec = _mismatch_op_spec(manifest)
    domain, op_type = spec.get("domain", PLUGIN_NAMESPACE), spec.get("op_type", PLUGIN_NAME)
    idx = [i for i, n in enumerate(graph.node) if n.op_type == op_type and n.domain == domain
           and not any(a.name == "plugin_namespace" for a in n.attribute)]  # already in plugin form
    if not idx:
        return out
    if len(idx) > 1:
        raise ValueError(f"{len(idx)} {domain}::{op_type} nodes in the graph, expected one")
    i = idx[0]
    node = graph.node[i]
    if len(node.input) != 2 or len(node.output) != 4:
        raise ValueError(f"{domain}::{op_type} node has {len(node.input)} inputs / {len(node.output)} outputs, "
                         "expected (logits, mismatch_tau) -> (top_ids, top_probs, flag_pos, correction)")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    mask_id = int(attrs.get("mask_token_id", manifest.mask_token_id))
    eos_id = int(attrs.get("eos_token_id", manifest.eos_token_id))
    logits, tau_input = node.input[0], node.input[1]
    top_ids, top_probs, flag_pos, correction = node.output
    p = "recguide_plugin_"
    new_nodes = [
        helper.make_node("Shape", [logits], [p + "rows"], name=p + "shape_rows", start=0, end=1),
        helper.make_node("Shape", [logits], [p + "len"], name=p + "shape_len", start=1, end=2),
        helper.make_node("Expand", [p + "len", p + "rows"], [p + "lengths_i64"], name=p + "expand_lengths"),
        helper.make_node("Cast", [p + "lengths_i64"], [p + "lengths"], name=p + "cast_lengths", to=TensorProto.INT32),
        helper.make_node(PLUGIN_NAME, [logits, p + "lengths"],
                         [p + "top_ids", top_probs, p + "flag_pos", p + "correction"],
                         name=node.name or "recguide_mismatch_predict", domain=PLUGIN_NAMESPACE,
                         mask_token_id=mask_id, eos_token_id=eos_id, tau=float(tau),
                         plugin_namespace=PLUGIN_NAMESPACE, plugin_version=PLUGIN_VERSION),
        helper.make_node("Cast", [p + "top_ids"], [top_ids], name=p + "cast_top_ids", to=TensorProto.INT64),
        helper.make_node("Cast", [p + "flag_pos"], [flag_pos], name=p + "cast_flag_pos", to=TensorProto.INT64),
        helper.make_node("Cast", [p + "correction"], [correction], name=p + "cast_correction",
                         to=TensorProto.INT64),
    ]
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes[:i] + new_nodes + nodes[i + 1:])
    # Drop the function body: the parser must import the node from the plugin registry.
    funcs = [f for f in out.functions if not (f.domain == domain and f.name == op_type)]
    del out.functions[:]
    out.functions.extend(funcs)
    if not any(o.domain == PLUGIN_NAMESPACE for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(PLUGIN_NAMESPACE, 1))
    # The tau input is now an attribute; remove the input when nothing else reads it.
    used = {x for n in graph.node for x in n.input} | {o.name for o in graph.output}
    if tau_input not in used:
        keep = [v for v in graph.input if v.name != tau_input]
        del graph.input[:]
        graph.input.extend(keep)
    return out


def engine_inputs_after_rewrite(model: Any) -> list[str]:
    return [v.name for v in model.graph.input if v.name not in {i.name for i in model.graph.initializer}]


def find_plugin_library(explicit: str | None = None) -> Path | None:
    """``--plugin-lib``, else plugins/build/librecguide_plugins.so of the source checkout, else None."""
    if explicit:
        p = Path(explicit)
        if not p.is_file():
            raise FileNotFoundError(f"plugin library {p} not found; build it with "
                                    "`cmake -S plugins -B plugins/build -DTENSORRT_ROOT=... && cmake --build plugins/build`")
        return p
    for cand in (REPO_ROOT / "plugins" / "build" / PLUGIN_LIBRARY, Path.cwd() / PLUGIN_LIBRARY):
        if cand.is_file():
            return cand
    return None


# ------------------------------------------------------------------------------------------------
# TensorRT parts
# ------------------------------------------------------------------------------------------------
class TensorRTMissing(RuntimeError):
    pass


def import_tensorrt() -> Any:
    try:
        import tensorrt as trt  # noqa: F401
    except Exception as exc:  # ImportError, or the PyPI placeholder failing to fetch its wheel
        raise TensorRTMissing(INSTALL_HINT) from exc
    if not hasattr(trt, "Builder"):
        raise TensorRTMissing(INSTALL_HINT + " (the installed `tensorrt` package is only a placeholder)")
    return trt


def make_progress_monitor(trt: Any, stream=None) -> Any:
    """An ``IProgressMonitor`` printing a tqdm-like line per phase (nested phases indented)."""
    stream = stream or sys.stderr

    class Progress(trt.IProgressMonitor):
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)
            self.phases: dict[str, tuple[int, int, float]] = {}

        def phase_start(self, phase_name, parent_phase, num_steps):
            depth = self.phases[parent_phase][1] + 1 if parent_phase in self.phases else 0
            if depth:
                print(file=stream)  # keep the parent's bar on its own line
            self.phases[phase_name] = (int(num_steps), depth, time.perf_counter())
            self._draw(phase_name, 0)

        def step_complete(self, phase_name, step):
            self._draw(phase_name, int(step) + 1)
            return True  # never cancel

        def phase_finish(self, phase_name):
            steps, depth, t0 = self.phases.pop(phase_name, (0, 0, time.perf_counter()))
            print(f"\r{'  ' * depth}{phase_name}: done in {time.perf_counter() - t0:.1f}s" + " " * 20,
                  file=stream, flush=True)

        def _draw(self, phase_name, done):
            steps, depth, t0 = self.phases.get(phase_name, (0, 0, time.perf_counter()))
            width = 24
            filled = int(width * done / steps) if steps else 0
            bar = "#" * filled + "-" * (width - filled)
            print(f"\r{'  ' * depth}{phase_name}: |{bar}| {done}/{steps} {time.perf_counter() - t0:.1f}s",
                  end="", file=stream, flush=True)

    return Progress()


def apply_precision(trt: Any, config: Any, precision: str) -> str:
    """Set the FP16/BF16 builder flag (weakly typed TensorRT). Returns a note for ``engine.json``.

    TensorRT >= 11 has no precision flags (networks are strongly typed: types come from the ONNX
    graph, which the export writes in float32); there ``fp16``/``bf16`` raise a clear error.
    """
    if precision == "fp32":
        return "fp32"
    flag = getattr(trt.BuilderFlag, precision.upper(), None)
    if flag is None:
        raise RuntimeError(f"TensorRT {trt.__version__} is strongly typed (no {precision.upper()} builder flag): "
                           f"the engine's precision follows the ONNX graph, which is float32; build with "
                           f"--precision fp32, or convert the export to {precision} first")
    config.set_flag(flag)
    return precision


def load_plugins(trt: Any, logger: Any, plugin_lib: Path | None) -> Any:
    """Register TensorRT's own plugins and ours; return the library handle (keep it alive)."""
    trt.init_libnvinfer_plugins(logger, "")
    if plugin_lib is None:
        return None
    registry = trt.get_plugin_registry()
    handle = None
    if hasattr(registry, "load_library"):
        handle = registry.load_library(str(plugin_lib))
    if handle is None:  # older TensorRT, or getCreators not picked up: register through the C entry point
        import ctypes

        lib = ctypes.CDLL(str(plugin_lib), mode=ctypes.RTLD_GLOBAL)
        if hasattr(lib, "recguide_register_plugins"):
            lib.recguide_register_plugins.restype = ctypes.c_bool
            if not lib.recguide_register_plugins():
                raise RuntimeError(f"{plugin_lib}: recguide_register_plugins() failed")
        handle = lib
    creator = registry.get_creator(PLUGIN_NAME, PLUGIN_VERSION, PLUGIN_NAMESPACE) \
        if hasattr(registry, "get_creator") else None
    if creator is None and hasattr(registry, "get_plugin_creator"):
        creator = registry.get_plugin_creator(PLUGIN_NAME, PLUGIN_VERSION, PLUGIN_NAMESPACE)
    if creator is None:
        raise RuntimeError(f"{plugin_lib} loaded, but plugin {PLUGIN_NAMESPACE}::{PLUGIN_NAME} v{PLUGIN_VERSION} "
                           "is not in the registry")
    return handle


def build_engine(onnx_dir: str | Path, name: str | None = None, precision: str | None = None,
                 plugin_lib: str | None = None, timing_cache: str | None = None,
                 workspace_gb: float | None = None, tau: float | None = None, out_root: str | Path | None = None,
                 config_path: str | Path | None = None, log=print) -> Path:
    """Build ``<out_root>/<name>/model.engine`` (+ manifest.json, engine.json); return that directory."""
    import onnx

    settings = load_build_config(config_path)
    precision = precision or settings["precision"]
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    workspace_gb = float(workspace_gb if workspace_gb is not None else settings["workspace_gb"])
    tau = float(tau if tau is not None else settings["tau"])
    onnx_dir = Path(onnx_dir)
    manifest = ExportManifest.load(onnx_dir)
    onnx_path = onnx_dir / manifest.onnx_file
    if not onnx_path.is_file():
        raise FileNotFoundError(f"{onnx_path} not found (run `recguide export` first)")
    name = name or f"{onnx_dir.resolve().name}-{precision}"
    root = Path(out_root or settings["out_root"])
    if not root.is_absolute():
        root = REPO_ROOT / root if (REPO_ROOT / "build").is_dir() else Path.cwd() / root
    out_dir = root / name
    cache_path = timing_cache or settings["timing_cache"]
    cache_path = Path(cache_path) if cache_path else None
    if cache_path is not None and not cache_path.is_absolute():
        cache_path = (REPO_ROOT if (REPO_ROOT / "build").is_dir() else Path.cwd()) / cache_path

    trt = import_tensorrt()
    logger = trt.Logger(trt.Logger.WARNING)
    lib_path = find_plugin_library(plugin_lib or settings["plugin_lib"])
    model = onnx.load(str(onnx_path), load_external_data=False)
    rewritten = rewrite_mismatch_for_plugin(model, manifest, tau=tau)
    uses_plugin = any(n.op_type == PLUGIN_NAME for n in rewritten.graph.node)
    if uses_plugin and lib_path is None:
        raise RuntimeError("the graph uses the MismatchPredict plugin but no plugin library was found: build "
                           "plugins/ (cmake -S plugins -B plugins/build -DTENSORRT_ROOT=...) or pass --plugin-lib")
    _plugin_handle = load_plugins(trt, logger, lib_path if uses_plugin else None)  # noqa: F841 (keep alive)

    builder = trt.Builder(logger)
    flags = 0
    if int(trt.__version__.split(".")[0]) < 10 and hasattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH"):
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    log(f"parsing {onnx_path} ({'with' if uses_plugin else 'without'} the {PLUGIN_NAME} plugin)")
    # Parse the rewritten graph from memory; `path` lets the parser find model.onnx.data.
    if not parser.parse(rewritten.SerializeToString(), str(onnx_path)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise RuntimeError("ONNX parser failed:\n  " + "\n  ".join(errors))
    engine_inputs = [network.get_input(i).name for i in range(network.num_inputs)]
    engine_outputs = [network.get_output(i).name for i in range(network.num_outputs)]

    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gb * (1 << 30)))
    if hasattr(config, "builder_optimization_level"):
        config.builder_optimization_level = int(settings["builder_optimization_level"])
    precision_note = apply_precision(trt, config, precision)
    profile_index: dict[str, int] = {}
    order = [p for p in PROFILE_ORDER if p in manifest.profiles] + [
        p for p in manifest.profiles if p not in PROFILE_ORDER]
    for pname in order:
        prof = builder.create_optimization_profile()
        for tname, (mn, opt, mx) in profile_shapes(manifest, pname, engine_inputs).items():
            prof.set_shape(tname, mn, opt, mx)
        profile_index[pname] = config.add_optimization_profile(prof)
        log(f"profile {pname} -> index {profile_index[pname]}")
    cache_bytes = cache_path.read_bytes() if cache_path is not None and cache_path.is_file() else b""
    cache = config.create_timing_cache(cache_bytes)
    config.set_timing_cache(cache, ignore_mismatch=False)
    if hasattr(trt, "IProgressMonitor"):
        config.progress_monitor = make_progress_monitor(trt)

    t0 = time.perf_counter()
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError("TensorRT engine build failed (see the log above)")
    seconds = time.perf_counter() - t0
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / ENGINE_FILE).write_bytes(bytes(serialized))
    shutil.copyfile(onnx_dir / MANIFEST_NAME, out_dir / MANIFEST_NAME)
    if cache_path is not None:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        cache_path.write_bytes(bytes(config.get_timing_cache().serialize()))
    info = {
        "profiles": profile_index, "inputs": engine_inputs, "outputs": engine_outputs, "tau": tau,
        "precision": precision_note, "plugin": uses_plugin, "plugin_lib": str(lib_path) if lib_path else None,
        "tensorrt": trt.__version__, "onnx_dir": str(onnx_dir.resolve()), "build_seconds": round(seconds, 1),
        "config_fingerprint": manifest.config_fingerprint, "weights_key": manifest.weights_key,
    }
    (out_dir / ENGINE_INFO).write_text(json.dumps(info, indent=2) + "\n")
    log(f"engine written to {out_dir / ENGINE_FILE} ({seconds:.0f}s)")
    return out_dir


# ------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m recguide_trt.engine.build",
                                 description="Build a TensorRT engine (draft/verify/prefill profiles) from an ONNX "
                                             "export of `recguide export`.")
    ap.add_argument("--onnx-dir", required=True, help="export directory (model.onnx + manifest.json)")
    ap.add_argument("--name", default=None, help="engine name: build/engines/<name>/ (default: <onnx dir>-<precision>)")
    ap.add_argument("--precision", choices=PRECISIONS, default=None, help="default: from build/configs/default.json")
    ap.add_argument("--plugin-lib", default=None, help="librecguide_plugins.so (default: plugins/build/)")
    ap.add_argument("--timing-cache", default=None, help="timing cache file, read and updated")
    ap.add_argument("--workspace-gb", type=float, default=None)
    ap.add_argument("--tau", type=float, default=None, help="mismatch threshold baked into the plugin")
    ap.add_argument("--out-root", default=None, help="directory holding engine directories (default build/engines)")
    ap.add_argument("--config", default=None, help="build settings JSON (default build/configs/default.json)")
    return ap


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Build from parsed :func:`build_parser` arguments; returns the exit code."""
    try:
        import_tensorrt()
    except TensorRTMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        build_engine(args.onnx_dir, name=args.name, precision=args.precision, plugin_lib=args.plugin_lib,
                     timing_cache=args.timing_cache, workspace_gb=args.workspace_gb, tau=args.tau,
                     out_root=args.out_root, config_path=args.config)
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
