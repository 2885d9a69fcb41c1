"""The padded-vs-packed forward benchmark (scripts/bench_packing.py)."""

from __future__ import annotations

import numpy as np
import pytest

from recguide_trt.bench.packing import main, mixed_batch, parse_mix
from recguide_trt.model.checkpoint import save_checkpoint
from tests.conftest import random_model, tiny_config


def test_parse_mix():
    assert parse_mix("2x1+1x4") == [1, 1, 4]
    assert parse_mix("4X8") == [8] * 4
    for bad in ("4", "x8", "0x4", "2x1+abc"):
        with pytest.raises(ValueError, match="ROWSxTOKENS|must be >= 1"):
            parse_mix(bad)


def test_mixed_batch_rows():
    b = mixed_batch([1, 1, 4], past_len=5, vocab_size=50)
    b.validate(max_slots=3, slot_capacity=16)
    assert b.row_lens.tolist() == [1, 1, 4] and b.input_ids.shape == (3, 4)
    assert not b.draft_gate[:2].any() and b.draft_gate[2].tolist() == [0, 1, 1, 1]   # causal seed ungated
    assert b.position_ids[2].tolist() == [5, 6, 7, 8] and b.position_ids[0].tolist() == [5, 5, 5, 5]
    assert not b.write_kv


def test_main_prints_one_row_per_mix(tmp_path, capsys):
    path = tmp_path / "rand"
    model = random_model(tiny_config())
    model.attach_draft_adapter(rank=4, alpha=8.0)
    save_checkpoint(model, path)
    assert main(["--model", str(path), "--mixes", "2x1,1x1+1x4", "--reps", "2", "--past-len", "4"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| ")]
    assert [ln.split("|")[1].strip() for ln in lines[1:]] == ["2x1", "1x1+1x4"]
    ratios = [float(ln.split("|")[4]) for ln in lines[1:]]
    assert all(np.isfinite(r) and r > 0 for r in ratios)
    with pytest.raises(SystemExit):
        main(["--model", str(path), "--mixes", "2y1"])
