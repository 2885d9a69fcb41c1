"""The engine's prefix cache: a prompt prefix that a slot already holds is copied, not prefilled, and no
output changes (bit-identical on the native backend, which is chunk-invariant)."""

from __future__ import annotations

import numpy as np
import pytest

from recguide_trt import LLM, EngineConfig, SamplingParams
from recguide_trt.backends.base import ForwardBatch
from recguide_trt.model import masks
from recguide_trt.runtime.prefix_cache import Match, PrefixCache, common_prefix
from tests.conftest import EMBEDDED, has_embedded

from .helpers import fake_engine, flat_cost_table

pytestmark = pytest.mark.skipif(not has_embedded(), reason="embedded model not trained yet")


def test_common_prefix_and_lookup():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0 and common_prefix([7, 1], [1, 1]) == 0
    cache = PrefixCache()
    cache.hold(0, [5, 6, 7, 8])
    cache.hold(1, [5, 6])
    cache.hold(2, [])                      # nothing held: no record
    assert cache.slots == [0, 1]
    assert cache.lookup([5, 6, 7, 8]) == Match(0, 3)          # the last prompt token always runs
    assert cache.lookup([5, 6, 9, 1], running=[(4, [5, 6, 9, 9])]) == Match(4, 3)
    assert cache.lookup([9, 5]) is None and cache.lookup([5]) is None
    assert (cache.queries, cache.hits) == (4 + 4 + 2 + 1, 3 + 3)
    cache.drop(0)
    assert cache.lookup([5, 6, 7]) == Match(1, 2)
    cache.hold(0, [5, 6, 7, 8])
    cache.hold(2, [9])
    cache.truncate(2)                      # positions 2 and on were overwritten
    assert cache.held(0).tolist() == [5, 6] and cache.held(2).tolist() == [9]
    cache.truncate(0)
    assert cache.slots == []
    cache.hold(0, [5])
    cache.clear()
    assert cache.slots == [] and cache.stats()["held_slots"] == 0


def test_a_record_covering_another_replaces_it():
    cache = PrefixCache()
    cache.hold(0, [5, 6, 7])
    cache.hold(1, [5, 6])
    assert cache.covered(1) and not cache.covered(0)
    cache.hold(2, [5, 6, 7, 8])          # covers both: they go
    assert cache.slots == [2] and list(cache.held(2)) == [5, 6, 7, 8] and not cache.covered(2)


def test_choose_keeps_records_where_it_can():
    cache = PrefixCache()
    cache.hold(0, [1, 2, 3, 4])
    cache.hold(1, [7, 8])
    cache.hold(2, [9, 9])
    # A partial match with an empty slot free: the prefix goes there and record 0 stays whole.
    assert cache.choose([0, 1, 3], Match(0, 2)) == 3
    # The whole record used (a chat's next turn): its own slot, no copy, nothing lost.
    assert cache.choose([0, 1, 3], Match(0, 4)) == 0
    # No empty slot: losing record 0's tail beats losing another record.
    assert cache.choose([0, 1, 2], Match(0, 2)) == 0
    # No match, or a running request's slot: an empty slot, else the record used longest ago.
    assert cache.choose([1, 2, 5, 3], None) == 3
    cache.lookup([9, 9, 1])              # record 2 is used, so record 1 is now the oldest
    assert cache.choose([1, 2], Match(6, 1)) == 1


def test_prefix_cache_setting_is_checked():
    with pytest.raises(ValueError, match="prefix_cache must be True or False"):
        EngineConfig(prefix_cache="yes").validate()


@pytest.fixture(scope="module")
def native():
    return LLM(EMBEDDED, backend="native", engine_config=EngineConfig(max_num_seqs=4, max_model_len=512,
                                                                     cost_table=flat_cost_table()))


def test_native_prefill_is_chunk_invariant(native):
    """The property the cache's losslessness rests on: K/V and logits of a prompt prefilled in two forwards
    (a cached prefix, then the rest) are bit-identical to one forward's."""
    be = native.backend

    def prefill(slot, ids, past):
        n = len(ids)
        return be.forward(ForwardBatch(
            slots=np.array([slot]), past_lens=np.array([past]), input_ids=np.array([ids]),
            position_ids=np.array([past + np.arange(n)]), intra_mask=masks.causal(n)[None],
            draft_gate=np.zeros((1, n), np.float32), want_logits=np.array([True]), row_lens=np.array([n])))

    prompt = native.encode("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n")
    full = prefill(0, prompt, 0)
    for k in (1, len(prompt) // 2, len(prompt) - 1):
        prefill(1, prompt[:k], 0)
        tail = prefill(1, prompt[k:], k)
        assert np.array_equal(full.logits[0, k:], tail.logits[0]), k
        for cache in (be.k_cache, be.v_cache):
            assert all(np.array_equal(c[0, :, :len(prompt)].numpy(), c[1, :, :len(prompt)].numpy()) for c in cache), k


SYSTEM = "# A small library of list utilities, tested with pytest.\nimport itertools\n\n"
TASKS = ["def flatten(xs):", "def chunks(xs, n):", "def dedupe(xs):", "def rotate(xs, k):", "def window(xs, n):",
         "def interleave(a, b):", "def argmax(xs):", "def pairwise(xs):", "def running_sum(xs):"]


def _params(i: int) -> SamplingParams:
    """A mix: greedy rows of every policy kind and seeded sampling rows, with different lengths so that requests
    finish out of order (slots are freed, reused and compacted while others run)."""
    kinds = [dict(policy="ar"), dict(policy="linearspec", block_size=4), dict(policy="recguide"),
             dict(policy="linearspec", block_size=8, temperature=0.8, seed=i)]
    return SamplingParams(max_tokens=12 + 7 * (i % 4), **kinds[i % len(kinds)])


def test_outputs_are_bit_identical_with_the_cache(native):
    """Nine prompts sharing a prefix through four slots, twice, against the same engine without a cache."""
    prompts = [native.encode(SYSTEM + t) for t in TASKS]
    params = [_params(i) for i in range(len(prompts))]
    off = LLM(EMBEDDED, backend="native", engine_config=EngineConfig(
        max_num_seqs=4, max_model_len=512, cost_table=flat_cost_table(), prefix_cache=False))
    want = [o.token_ids for o in off.generate(prompts, params)]
    assert off.engine.prefix_cache is None
    assert all(o.metrics.cached_prompt_tokens == 0 for o in off.generate(prompts[:2], params[:2]))

    shared = common_prefix(prompts[0], prompts[1])
    assert shared >= 10
    for attempt in range(2):
        outs = native.generate(prompts, params)
        assert [o.token_ids for o in outs] == want, attempt
        cached = [o.metrics.cached_prompt_tokens for o in outs]
        # Each round reuses the shared prefix: from the start of the second, from the first request on.
        assert sum(c >= shared for c in cached) >= len(prompts) - (4 if attempt == 0 else 0), cached
    # Three prompts fit the four slots: the next round finds each one whole (all but its last token).
    for attempt in range(2):
        outs = native.generate(prompts[:3], params[:3])
        assert [o.token_ids for o in outs] == want[:3], attempt
    assert [o.metrics.cached_prompt_tokens for o in outs] == [len(p) - 1 for p in prompts[:3]]
    stats = native.engine.stats()["prefix_cache"]
    assert 0 < stats["hit_tokens"] < stats["queried_tokens"]


def test_a_later_chat_turn_reuses_the_earlier_turn_and_its_answer(native):
    first = native.encode(SYSTEM + TASKS[0])
    answer = native.generate([first], SamplingParams(max_tokens=16, policy="ar"))[0].token_ids
    follow = first + answer + native.encode("\n\ndef test_flatten():")
    out = native.generate([follow], SamplingParams(max_tokens=8, policy="linearspec", block_size=4))[0]
    # Every token but the last answer token (emitted, never run through the model) is in the cache.
    assert out.metrics.cached_prompt_tokens == len(first) + len(answer) - 1
    ref = LLM(EMBEDDED, backend="native", engine_config=EngineConfig(
        max_num_seqs=1, max_model_len=512, cost_table=flat_cost_table(), prefix_cache=False))
    assert out.token_ids == ref.generate([follow], SamplingParams(max_tokens=8, policy="ar"))[0].token_ids


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_measuring_the_cost_table_keeps_what_its_probes_did_not_write(backend, tmp_path, monkeypatch):
    """The first RecGuide request measures the step-cost table; its probe forwards write every slot's K/V from
    ``cost_past_len`` on. The prefix cache keeps each record's tokens before that (it forgot every record
    before), and a table loaded from disk writes nothing, so the next engine keeps whole records."""
    from recguide_trt.cache import cache_root
    from recguide_trt.runtime.reference import reference_greedy

    from .helpers import assert_lossless

    if (cache_root() / "native").is_dir():   # a fresh cost-table cache, the kernel already built
        (tmp_path / "native").symlink_to(cache_root() / "native")
    monkeypatch.setenv("RECGUIDE_CACHE", str(tmp_path))
    past = 16
    for measured in (True, False):
        llm = LLM(EMBEDDED, backend=backend, engine_config=EngineConfig(max_num_seqs=2, max_model_len=256,
                                                                       cost_past_len=past))
        long, short = llm.encode(SYSTEM + TASKS[0]), llm.encode("def add(a, b):")
        assert len(short) < past < len(long)
        llm.generate([long, short], SamplingParams(max_tokens=6, policy="ar"))
        outs = llm.generate([long, short], SamplingParams(max_tokens=12, policy="recguide"))
        assert llm.engine.policies["recguide"].cost.meta["past_len"] == past
        cached = [o.metrics.cached_prompt_tokens for o in outs]
        assert cached == [past if measured else len(long) - 1, len(short) - 1], (measured, cached)
        refs = [reference_greedy(llm.checkpoint.model, p, 12, llm.config.eos_token_id) for p in (long, short)]
        assert_lossless([o.token_ids for o in outs], [r[0] for r in refs], [r[1] for r in refs],
                        what=f"{backend}, measured={measured}")


def test_cancelled_requests_keep_and_failed_ones_drop_their_prefix():
    engine = fake_engine(max_num_seqs=2)
    a = engine.submit([5, 6, 7, 8, 9], SamplingParams(max_tokens=30))
    engine.step()                                  # a's prompt is in its slot now
    b = engine.submit([5, 6, 7, 10], SamplingParams(max_tokens=30))
    engine.step()
    assert b.metrics.cached_prompt_tokens == 3     # from a, running beside it
    engine.cancel(a.id)
    engine._fail(b, "injected")
    engine.step()
    assert engine.prefix_cache.slots == [a.slot]
    c = engine.submit([5, 6, 7, 8, 9, 11], SamplingParams(max_tokens=4))
    engine.run_until_done()
    assert c.metrics.cached_prompt_tokens >= 5 and c.error is None


def test_compacting_backend_copies_prefixes_losslessly():
    """The torch backend keeps running requests in slots 0 … n-1, so prefixes are copied between slots and
    compaction moves them; greedy outputs equal the reference up to its near-ties (the torch backend's
    arithmetic is not chunk-invariant, as for its decode forwards)."""
    from recguide_trt.runtime.reference import reference_greedy

    from .helpers import assert_lossless

    llm = LLM(EMBEDDED, backend="torch", engine_config=EngineConfig(max_num_seqs=4, max_model_len=512,
                                                                   cost_table=flat_cost_table()))
    assert llm.engine._compacts
    prompts = [llm.encode(SYSTEM + t) for t in TASKS]
    params = [SamplingParams(max_tokens=10 + 5 * (i % 3), policy=["ar", "linearspec", "recguide"][i % 3])
              for i in range(len(prompts))]
    refs = [reference_greedy(llm.checkpoint.model, p, q.max_tokens, llm.config.eos_token_id)
            for p, q in zip(prompts, params)]
    for attempt in range(2):
        outs = llm.generate(prompts, params)
        assert_lossless([o.token_ids for o in outs], [r[0] for r in refs], [r[1] for r in refs],
                        what=f"round {attempt}")
        assert sum(o.metrics.cached_prompt_tokens > 0 for o in outs) >= len(prompts) - 4


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_a_prefix_is_copied_from_a_running_request_over_other_kv(backend):
    """The copy path: the slot a request gets holds another prompt's K/V, and its prefix comes from a running
    request's slot. A copy that went wrong would leave the other prompt's K/V under this prompt's tail."""
    from recguide_trt.runtime.reference import reference_greedy

    from .helpers import assert_lossless

    llm = LLM(EMBEDDED, backend=backend, engine_config=EngineConfig(max_num_seqs=4, max_model_len=512,
                                                                   cost_table=flat_cost_table()))
    others = [llm.encode(t) for t in ("import os\nimport sys\n\n", "class Stack:\n    def __init__(self):",
                                      "# Parse a CSV file\nimport csv\n", "def main() -> None:\n    args = ")]
    llm.generate(others, SamplingParams(max_tokens=6, policy="ar"))   # every slot holds an unrelated prompt
    first, second = (llm.encode(SYSTEM + t) for t in TASKS[:2])
    engine = llm.engine
    a = engine.submit(first, SamplingParams(max_tokens=30, policy="ar"))
    engine.step()
    assert a.cache_len == len(first) and not a.done                 # a is prefilled and running
    b = engine.submit(second, SamplingParams(max_tokens=16, policy="linearspec", block_size=4))
    engine.run_until_done()
    assert b.metrics.cached_prompt_tokens == common_prefix(first, second) > 10
    ref = reference_greedy(llm.checkpoint.model, second, 16, llm.config.eos_token_id)
    assert_lossless([b.output_ids], [ref[0]], [ref[1]], what=backend)


def test_prefix_cache_slots_are_checked():
    with pytest.raises(ValueError, match="prefix_cache_slots must be an integer >= 0"):
        EngineConfig(prefix_cache_slots=-1).validate()
    with pytest.raises(ValueError, match="prefix_cache_slots=2 needs prefix_cache=True"):
        EngineConfig(prefix_cache_slots=2, prefix_cache=False).validate()


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_prefix_cache_slots_keep_more_prompts_than_max_num_seqs(backend):
    """Nine prompts through four running slots and nine cache-only ones: the second round finds every prompt
    whole. On the torch backend, which compacts, a record is moved into the extra slots before its slot is
    overwritten; on the native one requests run wherever a slot is free. At most four run at once."""
    from recguide_trt.runtime.reference import reference_greedy

    from .helpers import assert_lossless

    llm = LLM(EMBEDDED, backend=backend, engine_config=EngineConfig(
        max_num_seqs=4, max_model_len=512, cost_table=flat_cost_table(), prefix_cache_slots=9))
    assert llm.backend.max_slots == 13
    prompts = [llm.encode(SYSTEM + t) for t in TASKS]
    params = [SamplingParams(max_tokens=10 + 5 * (i % 3), policy=["ar", "linearspec", "recguide"][i % 3])
              for i in range(len(prompts))]
    first = llm.generate(prompts, params)
    again = llm.generate(prompts, params)
    assert [o.metrics.cached_prompt_tokens for o in again] == [len(p) - 1 for p in prompts]
    assert max(llm.engine.concurrency_hist) == 4
    refs = [reference_greedy(llm.checkpoint.model, p, q.max_tokens, llm.config.eos_token_id)
            for p, q in zip(prompts, params)]
    for outs in (first, again):
        assert_lossless([o.token_ids for o in outs], [r[0] for r in refs], [r[1] for r in refs], what=backend)
    if backend == "native":
        assert [o.token_ids for o in again] == [o.token_ids for o in first]


def test_evacuation_never_overwrites_the_slot_a_prefix_is_copied_from():
    """Torch (compacting), one running slot and one cache-only slot. A's prompt is moved to the cache slot when B
    takes slot 0; C extends A's prompt, so its prefix comes from the cache slot, the only place B's record could be
    moved to. Moving B there first would copy B's K/V under C's prompt."""
    from recguide_trt.runtime.reference import reference_greedy

    from .helpers import assert_lossless

    llm = LLM(EMBEDDED, backend="torch", engine_config=EngineConfig(
        max_num_seqs=1, max_model_len=512, cost_table=flat_cost_table(), prefix_cache_slots=1))
    a, b = llm.encode(SYSTEM + TASKS[0]), llm.encode("import os\nimport sys\n\ndef main():")
    c = a + llm.encode("\n    return []")
    for p in (a, b):
        llm.generate([p], SamplingParams(max_tokens=4, policy="ar"))
    assert llm.engine.prefix_cache.slots == [0, 1]
    out = llm.generate([c], SamplingParams(max_tokens=12, policy="linearspec", block_size=4))[0]
    assert out.metrics.cached_prompt_tokens >= len(a) - 1
    ref = reference_greedy(llm.checkpoint.model, c, 12, llm.config.eos_token_id)
    assert_lossless([out.token_ids], [ref[0]], [ref[1]], what="copied prefix")
    # The K/V under C's prompt is A's, as a plain prefill of A computes it (the tiny model's greedy tokens alone
    # can survive a wrong context).
    plain = LLM(EMBEDDED, backend="torch", engine_config=EngineConfig(
        max_num_seqs=1, max_model_len=512, cost_table=flat_cost_table(), prefix_cache=False))
    plain.generate([a], SamplingParams(max_tokens=1, policy="ar"))
    n = len(a) - 1
    for got, want in zip(llm.backend.k_cache + llm.backend.v_cache, plain.backend.k_cache + plain.backend.v_cache):
        assert np.allclose(got[0, :, :n].numpy(), want[0, :, :n].numpy(), atol=1e-5)


def test_a_record_reused_in_place_keeps_its_tail_in_a_cache_slot():
    """Torch (compacting), one running slot and one cache-only slot. B shares A's system prompt, so it reuses
    that head of A's record in slot 0 and overwrites A's tail there; A's whole record is copied to the cache-only
    slot first, so A asked again (say, a chat's next turn) finds all of its prompt, and answers as AR does."""
    from recguide_trt.runtime.reference import reference_greedy

    from .helpers import assert_lossless

    llm = LLM(EMBEDDED, backend="torch", engine_config=EngineConfig(
        max_num_seqs=1, max_model_len=512, cost_table=flat_cost_table(), prefix_cache_slots=1))
    a, b = (llm.encode(SYSTEM + t) for t in TASKS[:2])
    shared = common_prefix(a, b)
    first = llm.generate([a], SamplingParams(max_tokens=4, policy="ar"))[0]
    out_b = llm.generate([b], SamplingParams(max_tokens=4, policy="ar"))[0]
    assert out_b.metrics.cached_prompt_tokens == shared > 10
    assert llm.engine.prefix_cache.slots == [0, 1]
    again = llm.generate([a], SamplingParams(max_tokens=12, policy="linearspec", block_size=4))[0]
    assert again.metrics.cached_prompt_tokens == len(a) - 1 > shared
    ref = reference_greedy(llm.checkpoint.model, a, 12, llm.config.eos_token_id)
    assert_lossless([again.token_ids, first.token_ids], [ref[0], ref[0][:4]], [ref[1], ref[1][:4]],
                    what="A after B")
