"""``SamplingParams.stop`` through ``LLM.generate``, stepping itself or with the background loop running: the text
ends before the stop string, and every policy returns the same text, tokens and log-probabilities. (``recguide
generate --stop`` through the console script: ``tests/test_cli.py``.)"""

from __future__ import annotations

import pytest

from recguide_trt import LLM, EngineConfig, SamplingParams
from tests.conftest import EMBEDDED, has_embedded
from tests.runtime.helpers import flat_cost_table

pytestmark = pytest.mark.skipif(not has_embedded(), reason="embedded model not trained yet")
PROMPTS = ["def fibonacci(n):", "import os\n", "class Stack:\n", "for i in range(10):\n"]
POLICIES = [dict(policy="ar"), dict(policy="linearspec", block_size=4), dict(policy="linearspec", block_size=8),
            dict(policy="recguide")]


@pytest.fixture(scope="module")
def tiny():
    return LLM(EMBEDDED, backend="native", engine_config=EngineConfig(max_num_seqs=4, max_model_len=512,
                                                                     cost_table=flat_cost_table()))


def test_every_policy_stops_at_the_same_token(tiny):
    plain = tiny.generate(PROMPTS, SamplingParams(max_tokens=40, policy="ar"))
    stops = [o.text[8:11] for o in plain]  # three characters from inside each answer
    assert all(s.strip() for s in stops), stops
    ref = None
    for background in (False, True):
        if background:
            tiny.start()
        for pol in POLICIES:
            outs = tiny.generate(PROMPTS, [SamplingParams(max_tokens=40, stop=[s, "\x00never"], logprobs=1, **pol)
                                           for s in stops])
            for o, p, s in zip(outs, plain, stops):
                assert o.finish_reason == "stop" and o.text == p.text[:p.text.index(s)], (pol, o.text)
                assert o.token_ids == p.token_ids[:len(o.token_ids)] and s in tiny.decode(o.token_ids)
                assert s not in tiny.decode(o.token_ids[:-1]) and len(o.logprobs) == len(o.token_ids)
            got = [(o.text, o.token_ids, o.logprobs) for o in outs]
            ref = ref or got
            assert got == ref, (pol, background)
    tiny.shutdown()


def test_a_stop_string_never_seen_changes_nothing(tiny):
    plain = tiny.generate(PROMPTS[:2], SamplingParams(max_tokens=20, policy="linearspec"))
    outs = tiny.generate(PROMPTS[:2], SamplingParams(max_tokens=20, policy="linearspec", stop="\x00never"))
    assert [(o.text, o.token_ids, o.finish_reason) for o in outs] == \
        [(o.text, o.token_ids, o.finish_reason) for o in plain]


@pytest.mark.parametrize("stop", [[""], 5, ["ok", 3]])
def test_bad_stop_names_the_field(tiny, stop):
    with pytest.raises(ValueError, match="stop must be a list of non-empty strings"):
        tiny.generate(["x"], SamplingParams(stop=stop))
