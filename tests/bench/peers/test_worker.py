"""The worker protocol: in process with a fake adapter, and end to end with our engine as a subprocess."""

from __future__ import annotations

import io
import json

import pytest

from recguide_trt.bench.peers import worker
from recguide_trt.bench.peers.client import Pool
from recguide_trt.bench.peers.rows import Row, our_rows
from recguide_trt.bench.peers.run import run_bench
from tests.conftest import has_embedded


class Echo:
    """Returns the prompt's last token repeated; ``short=True`` breaks the EOS-ignored contract."""

    def __init__(self, short: bool = False):
        self.short = short

    def serial(self, prompts, max_tokens, **knobs):
        return [[p[-1]] * (max_tokens - self.short) for p in prompts]

    batch = serial


def test_serve_answers_each_request_and_stops_at_quit():
    lines = [json.dumps({"op": "generate", "mode": m, "prompts": [[1, 5], [7]], "max_tokens": 3}) for m in
             ("serial", "batch")] + [json.dumps({"op": "quit"}), json.dumps({"op": "generate"})]
    out = io.StringIO()
    worker.serve(Echo(), lines, out)
    replies = [json.loads(x) for x in out.getvalue().splitlines()]
    assert len(replies) == 2
    assert replies[0]["outputs"] == [[5, 5, 5], [7, 7, 7]] and replies[0]["tokens"] == 6
    assert replies[0]["elapsed_s"] >= 0


def test_short_outputs_and_bad_modes_are_errors():
    r = worker.handle(Echo(short=True), {"mode": "batch", "prompts": [[1]], "max_tokens": 4})
    assert "not 4 tokens long" in r["error"]
    assert "KeyError" in worker.handle(Echo(), {"mode": "nope", "prompts": [[1]], "max_tokens": 4})["error"]


def test_unknown_adapter_fails_to_start():
    from recguide_trt.bench.peers import adapters

    out = io.StringIO()
    assert worker.start(adapters, "nonesuch", {}, out) is None
    hello = json.loads(out.getvalue())
    assert hello["ready"] is False and "unknown engine adapter" in hello["error"]


@pytest.mark.skipif(not has_embedded(), reason="embedded model missing")
@pytest.mark.timeout(120)
def test_our_engine_as_a_worker_process(tmp_path):
    """2 prompts x 4 tokens on the torch backend: lossless vs the reference, a missing peer and a
    backend that cannot be built are skipped with the reason."""
    rows = [r for r in our_rows(["torch"], default=False) if r.knobs["policy"] in ("ar", "linearspec")]
    rows += [Row("ours nosuch ar", "ours", {"backend": "nosuch"}, {"policy": "ar"}, ours=True),
             Row("Missing peer", "openvino-genai", venv="ov")]
    prompts = [[5, 77, 301, 1200, 9, 44], list(range(10, 30))]
    pool = Pool(tmp_path / "peers", tmp_path / "logs")
    try:
        res = run_bench(rows, prompts, pool, rounds=1, serial_prompts=2, batch_prompts=2, max_tokens=4,
                        reference="ours torch ar", log=lambda s: None)
    finally:
        pool.close()
    assert set(res["rows"]) == {"ours torch ar", "ours torch linearspec L8"}
    assert "unknown backend 'nosuch'" in res["skipped"]["ours nosuch ar"]
    assert res["skipped"]["Missing peer"].startswith("not installed")
    assert res["reference"] == "ours torch ar" and len(res["reference_outputs"][0]) == 4
    for r in res["rows"].values():
        for mode in ("serial", "batch"):
            assert r[mode]["tok_s"] and r[mode]["tok_s"][0] > 0
            assert (r[mode]["equal"], r[mode]["of"]) == (2, 2), r[mode]
    assert res["rows"]["ours torch ar"]["info"]["backend_class"] == "TorchBackend"
    # the lossless check against our AR of the same options (what a bf16 row is held to)
    for mode in ("serial", "batch"):
        assert res["rows"]["ours torch linearspec L8"][mode]["own_ar"] == {"label": "ours torch ar", "equal": 2,
                                                                           "of": 2}
        assert "own_ar" not in res["rows"]["ours torch ar"][mode]
