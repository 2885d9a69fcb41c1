"""``scripts/measure_memory.py`` as docs/engine.md runs it: RSS and KV bytes per token, float32 and bf16 KV."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import has_embedded

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not has_embedded(), reason="embedded model missing")
def test_bf16_kv_cache_halves_the_bytes_per_token(tmp_path):
    out = tmp_path / "memory.md"
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "measure_memory.py"), "--model", "tiny", "--backends",
                          "native,native:bfloat16", "--max-model-len", "256", "--out", str(out)],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = {m.group(1): int(m.group(2)) for m in re.finditer(r"^\| (native[^|]*?) \|.*\| (\d+) \|$", out.read_text(), re.M)}
    assert rows == {"native": 6144, "native (KV bfloat16)": 3072}, out.read_text()
