"""The peer table from a synthetic results dict: ratios, bests, equality, mismatches, skipped rows."""

from __future__ import annotations

from recguide_trt.bench.peers import report
from recguide_trt.bench.peers.run import compare


def cell(tok_s, equal=None, of=None, divs=()):
    c = {"tok_s": list(tok_s), "errors": []}
    if equal is not None:
        c.update(equal=equal, of=of, divergences=list(divs))
    return c


def results():
    rows = {
        "ours torch ar": {"ours": True, "info": {}, "serial": cell([90, 100], 2, 2), "batch": cell([400], 4, 4)},
        "ours default recguide": {"ours": True, "info": {"backend_class": "TorchBackend"},
                                  "serial": cell([150], 2, 2), "batch": cell([300], 4, 4)},
        "Peer A": {"ours": False, "info": {}, "serial": cell([200], 1, 2, [{"prompt": 1, "pos": 3, "ref": 7,
                                                                         "got": 9, "margin": {"fp32": 4e-4,
                                                                                              "fp64": 3.9e-4}}]),
                   "batch": cell([800], 4, 4)},
        "Peer B": {"ours": False, "info": {}, "serial": cell([50], 2, 2), "batch": cell([])},
    }
    rows["Peer B"]["batch"]["errors"].append("RuntimeError: boom")
    return {"rows": rows, "skipped": {"ours tensorrt ar": "no engine", "ours tensorrt recguide": "no engine"},
            "reference": "ours torch ar",
            "settings": {"rounds": 2, "serial_prompts": 2, "batch_prompts": 4, "max_tokens": 8}}


def test_fastest_and_best_round():
    r = results()
    assert report.best(r, "ours torch ar", "serial") == 100
    assert report.fastest(r, "serial", ours=False) == ("Peer A", 200)
    assert report.fastest(r, "serial", ours=True) == ("ours default recguide", 150)
    assert report.fastest(r, "batch", ours=True, prefix="ours default") == ("ours default recguide", 300)
    assert report.best(r, "Peer B", "batch") is None


def test_table_rows_ratios_and_summary():
    md = report.format_table(results())
    lines = md.splitlines()
    assert lines[0].startswith("| engine | batch-1 tok/s | x fastest peer | batch-4 tok/s")
    assert "| ours torch ar | 100 | 0.50x | 400 | 0.50x | 2/2 | 4/4 |" in lines
    assert "| ours default recguide (TorchBackend) | 150 | 0.75x | 300 | 0.38x | 2/2 | 4/4 |" in lines
    assert "| Peer A | 200 | 1.00x | 800 | 1.00x | 1/2 | 4/4 |" in lines
    assert "| Peer B | 50.0 | 0.25x | - | - | 2/2 | - |" in lines
    # Two picks naming one row share its line.
    assert ("- batch-1: our best = our best on `LLM()`'s default backend (ours default recguide, 150 tok/s) / fastest"
            " peer (Peer A, 200 tok/s) = **0.75x**" in lines)
    assert "- batch-4: our best (ours torch ar, 400 tok/s) / fastest peer (Peer A, 800 tok/s) = **0.50x**" in lines
    assert ("- batch-4: our best on `LLM()`'s default backend (ours default recguide, 300 tok/s) / fastest peer"
            " (Peer A, 800 tok/s) = **0.38x**" in lines)
    assert sum(ln.startswith("- batch-1: our best") for ln in lines) == 1
    assert any("Peer A, batch-1: prompt 1 token 3: ref 7, got 9; our fp32 logit margin ref - got = 4.00e-04" in ln
               for ln in lines)
    assert "- Peer B, batch: RuntimeError: boom" in lines
    assert "- ours tensorrt ar, ours tensorrt recguide: no engine" in lines


def test_no_peer_means_no_ratio():
    r = results()
    r["rows"] = {k: v for k, v in r["rows"].items() if v["ours"]}
    md = report.format_table(r)
    assert "no peer ran, no ratio" in md and "| ours torch ar | 100 | - | 400 | - |" in md


def test_compare_finds_first_divergence():
    same, divs = compare([[1, 2, 3], [4, 5, 6], [7, 8]], [[1, 2, 3], [4, 9, 6], [7]])
    assert same == 1
    assert divs == [{"prompt": 1, "pos": 1, "ref": 5, "got": 9}, {"prompt": 2, "pos": 1, "ref": 8, "got": None}]


def test_bf16_rows_get_their_own_summary_and_lossless_lines():
    r = results()
    r["rows"]["ours torch ar bf16"] = {"ours": True, "info": {}, "serial": cell([120], 1, 2), "batch": cell([900], 3, 4)}
    r["rows"]["ours torch recguide bf16"] = {"ours": True, "info": {}, "serial": cell([160], 1, 2),
                                             "batch": cell([850], 3, 4)}
    for mode, of in (("serial", 2), ("batch", 4)):
        r["rows"]["ours torch recguide bf16"][mode]["own_ar"] = {"label": "ours torch ar bf16", "equal": of, "of": of}
    lines = report.format_table(r).splitlines()
    assert ("- batch-4: our best in float32 (ours torch ar, 400 tok/s) / fastest peer (Peer A, 800 tok/s) = **0.50x**"
            in lines)
    assert ("- batch-4: our best = our best with bf16 compute (ours torch ar bf16, 900 tok/s) / fastest peer"
            " (Peer A, 800 tok/s) = **1.12x**" in lines)
    assert "- ours torch recguide bf16: 2/2 (batch-1), 4/4 (batch-4) equal to ours torch ar bf16" in lines
    plain = report.format_table(results())
    assert "bf16" not in plain and "lossless check" not in plain  # float32-only runs read as before


def test_kv16_rows_get_their_own_summary_and_leave_the_float32_line():
    r = results()
    r["rows"]["ours torch ar kv16"] = {"ours": True, "info": {}, "serial": cell([90], 1, 2), "batch": cell([700], 3, 4)}
    lines = report.format_table(r).splitlines()
    assert ("- batch-4: our best = our best in float32 (ours torch ar, 400 tok/s) / fastest peer (Peer A, 800 tok/s)"
            " = **0.50x**" not in lines)  # the kv16 row is faster, so "our best" names it, not the float32 row
    assert ("- batch-4: our best = our best with a bf16 KV cache (ours torch ar kv16, 700 tok/s) / fastest peer"
            " (Peer A, 800 tok/s) = **0.88x**" in lines)
    assert ("- batch-4: our best in float32 (ours torch ar, 400 tok/s) / fastest peer (Peer A, 800 tok/s) = **0.50x**"
            in lines)
