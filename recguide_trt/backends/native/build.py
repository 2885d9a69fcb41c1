"""Compile and load the native CPU forward (``nld_cpu.cpp``) as a PyTorch C++ extension.

The source ships with the package and is compiled on first use on the machine that runs it (so
``-march=native`` targets that CPU: AVX-512 where it has it, AVX2 elsewhere), about 30-60 s on
two cores; the built module is cached under ``native/`` in the package cache (:func:`~recguide_trt.cache.cache_root`) keyed by the source, the
torch version, the Python version and the CPU's flags, so later processes load it in well under a
second. Building needs a C++ compiler (g++) and ``ninja`` (a dependency of the package).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import platform
import sys
import threading
import time
from pathlib import Path
from types import ModuleType

from ...cache import cache_root

SOURCE = Path(__file__).resolve().parent / "nld_cpu.cpp"
CFLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-std=c++17", "-ffp-contract=off")
LDFLAGS = ("-pthread",)
ISA_ENV = "RECGUIDE_NATIVE_ISA"
_NO_AMX = ("-mno-amx-tile", "-mno-amx-bf16", "-mno-amx-int8")
ISA_FLAGS = {"native": (), "avx2": ("-mno-avx512f", *_NO_AMX),
             "scalar": ("-mno-avx512f", "-mno-avx2", "-mno-fma", *_NO_AMX)}
"""``RECGUIDE_NATIVE_ISA``: the vector path compiled in. ``native`` (default) is the best this CPU has;
``avx2`` and ``scalar`` force the paths CPUs without AVX-512 (or without AVX2) take, so a machine that
has AVX-512 can build and test them (each is cached under its own key). Neither has AMX, which no CPU
without AVX-512 has (``-mno-avx512f`` alone leaves it on)."""

log = logging.getLogger("recguide_trt")
_lock = threading.Lock()
_modules: dict[Path, ModuleType] = {}


class NativeBuildError(RuntimeError):
    """The native extension could not be compiled or loaded (the message says why)."""


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def cflags() -> tuple[str, ...]:
    """The compiler flags: :data:`CFLAGS` plus those of the ISA ``RECGUIDE_NATIVE_ISA`` asks for."""
    import os

    isa = os.environ.get(ISA_ENV, "native") or "native"
    if isa not in ISA_FLAGS:
        raise NativeBuildError(f"{ISA_ENV}={isa!r}: choose one of {', '.join(ISA_FLAGS)}")
    return CFLAGS + ISA_FLAGS[isa]


def build_key(source: Path = SOURCE) -> str:
    """What the compiled module depends on: source, compiler flags, torch, Python, CPU features."""
    import torch

    h = hashlib.sha256(Path(source).read_bytes())
    for part in (" ".join(cflags()), torch.__version__, sys.version, _cpu_flags()):
        h.update(part.encode())
    return h.hexdigest()[:16]


def load_native(source: Path | None = None) -> ModuleType:
    """The compiled extension module (built on first use; thread-safe, once per process).

    ``source``: another version of ``nld_cpu.cpp`` (a benchmark's "before" kernel), built and cached
    under its own key; default: the package's own :data:`SOURCE`.
    """
    source = Path(source or SOURCE).resolve()
    with _lock:
        if source in _modules:
            return _modules[source]
        key = build_key(source)
        name = f"recguide_nld_cpu_{key}"
        build_dir = cache_root() / "native" / key
        built = build_dir / f"{name}.so"
        if built.is_file():
            module = _import_built(name, built)
            module.kernel_key = key  # what it was built from (NativeBackend.kernel)
            _modules[source] = module
            return module
        build_dir.mkdir(parents=True, exist_ok=True)
        log.info("compiling the native CPU backend (once per machine; about a minute) into %s", build_dir)
        t0 = time.perf_counter()
        try:
            from torch.utils.cpp_extension import load

            module = load(name=name, sources=[str(source)], extra_cflags=list(cflags()),
                           extra_ldflags=list(LDFLAGS), build_directory=str(build_dir), verbose=False)
        except Exception as exc:  # compiler, ninja or headers missing: say which, not a deep traceback
            raise NativeBuildError(f"could not build the native CPU backend from {source}: "
                                   f"{str(exc).strip().splitlines()[-1] if str(exc).strip() else exc!r} "
                                   f"(needs g++ and the ninja package; backend='torch' works without them)") from exc
        log.info("native CPU backend built in %.1f s", time.perf_counter() - t0)
        module.kernel_key = key
        _modules[source] = module
        return module


def _import_built(name: str, path: Path) -> ModuleType:
    import torch  # noqa: F401  (the extension links against libtorch, which must be loaded first)

    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise NativeBuildError(f"cannot load the native CPU backend from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
