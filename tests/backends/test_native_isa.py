"""The native backend's other vector paths, built on an AVX-512 machine with the dispatch forced.

``RECGUIDE_NATIVE_ISA=avx2`` compiles the path CPUs without AVX-512 take (``-mno-avx512f``); the whole
native test file then runs against that build in a subprocess (a process loads one build), so the
AVX2 path meets the same checks as the default one: outputs vs the torch reference, batch
invariance, every policy equal to its own AR exactly.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from recguide_trt.backends.native import build as native_build

ROOT = Path(__file__).resolve().parents[2]


def _vector_path(env: dict) -> str:
    res = subprocess.run([sys.executable, "-c", "from recguide_trt.backends.native.build import load_native; "
                                                "print(load_native().vector_path())"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout.strip().splitlines()[-1]


def test_default_build_takes_the_widest_path():
    flags = native_build._cpu_flags().split()
    want = "avx512" if "avx512f" in flags else "avx2" if {"avx2", "fma"} <= set(flags) else "scalar"
    assert native_build.load_native().vector_path() == want


def test_unknown_isa_is_refused(monkeypatch):
    monkeypatch.setenv(native_build.ISA_ENV, "avx9")
    with pytest.raises(native_build.NativeBuildError, match="RECGUIDE_NATIVE_ISA='avx9'"):
        native_build.cflags()


@pytest.mark.skipif("avx2" not in native_build._cpu_flags().split(), reason="this CPU has no AVX2")
@pytest.mark.skipif("avx512f" not in native_build._cpu_flags().split(),
                    reason="this CPU has no AVX-512: its default build is the AVX2 path, which the native suite ran")
def test_avx2_path_passes_the_native_suite():
    env = dict(os.environ, **{native_build.ISA_ENV: "avx2"})
    assert _vector_path(env) == "avx2"
    # Every kernel test of the file; of the policies-over-the-kernel matrix, RecGuide in each arithmetic: the
    # fixed blocks run the same kinds of rows (verify, draft), so they add engine time, not kernel paths. And
    # the attention on bf16 pairs, whose dot kernel this build runs on emulated vdpbf16ps.
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                          "tests/backends/test_native_backend.py", "tests/backends/test_native_bf16_attention.py",
                          "-k", "not policies_equal_native_ar or recguide"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert " passed" in res.stdout.splitlines()[-1], res.stdout[-500:]
