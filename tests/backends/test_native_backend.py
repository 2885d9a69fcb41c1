"""The native CPU backend: same outputs as the torch reference, batch invariance, cache, errors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from recguide_trt import LLM, EngineConfig, SamplingParams
from recguide_trt.backends.base import ForwardBatch
from recguide_trt.backends.choice import default_backend
from recguide_trt.backends.native import build as native_build
from recguide_trt.backends.native_backend import NativeBackend
from recguide_trt.backends.torch_backend import TorchBackend
from recguide_trt.model.checkpoint import load_checkpoint
from recguide_trt.runtime.logprobs import log_sum_exp
from tests.conftest import EMBEDDED, has_embedded, random_model, tiny_config

SLOTS, CAP = 6, 160


def _batch(rng, B: int, T: int, vocab: int, past_max: int, gated: bool, mask_id: int | None = None) -> ForwardBatch:
    """A random batch; with ``mask_id``, a third of the tokens are MASK (in draft and in AR positions)."""
    lens = rng.integers(1, T + 1, B)
    lens[0] = T
    intra = rng.random((B, T, T)) < 0.5
    for b in range(B):  # the executor's convention: real queries never see padding keys
        intra[b, :, lens[b]:] = False
    intra[:, np.arange(T), np.arange(T)] = True
    gate = (rng.random((B, T)) < 0.5).astype(np.float32) if gated else np.zeros((B, T), np.float32)
    ids = rng.integers(0, vocab, (B, T))
    if mask_id is not None:
        ids[rng.random((B, T)) < 1 / 3] = mask_id
    return ForwardBatch(slots=rng.permutation(SLOTS)[:B].astype(np.int64), past_lens=rng.integers(0, past_max + 1, B),
                        input_ids=ids, position_ids=rng.integers(0, CAP - T, (B, T)),
                        intra_mask=intra, draft_gate=gate, want_logits=np.array([True] + [False] * (B - 1)),
                        row_lens=lens)


def _prefill(rng, B: int, n: int, vocab: int) -> ForwardBatch:
    return ForwardBatch(slots=np.arange(B), past_lens=np.zeros(B, np.int64), input_ids=rng.integers(0, vocab, (B, n)),
                        position_ids=np.tile(np.arange(n), (B, 1)), intra_mask=np.tile(np.tri(n, dtype=bool), (B, 1, 1)),
                        draft_gate=np.zeros((B, n), np.float32), want_logits=np.zeros(B, bool), row_lens=np.full(B, n))


def _models():
    """The embedded model, a random one with YaRN + llama-4 query scaling and head_dim 16, one with
    head_dim 8 (the scalar P·V path) and a draft adapter on every projection plus a draft MASK
    embedding, and one with head_dim 128."""
    out = []
    if has_embedded():
        out.append(("embedded", load_checkpoint(EMBEDDED).model))
    from recguide_trt.model import RopeConfig

    cfg = tiny_config(hidden_size=48, head_dim=16, rope=RopeConfig(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                                                  original_max_position_embeddings=64,
                                                                  llama_4_scaling_beta=0.1))
    out.append(("yarn-qscale", random_model(cfg, seed=1)))
    m = random_model(tiny_config(), seed=2)
    m.attach_draft_adapter(4, 8.0, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))
    m.attach_draft_mask_embedding()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "lora_B" in name or name == "draft_mask_embedding":
                p.normal_(0, 0.3)
    out.append(("adapter-hd8", m.eval()))
    # head_dim 128: AVX-512's P·V tiles take 3 query rows (8 panels each), not 6
    out.append(("hd128", random_model(tiny_config(hidden_size=64, head_dim=128), seed=3, std=0.1)))
    return out


@pytest.mark.parametrize("name,model", _models(), ids=lambda v: v if isinstance(v, str) else "")
def test_matches_torch_backend(name, model):
    rng = np.random.default_rng(0)
    tb, nb = TorchBackend(model, SLOTS, CAP), NativeBackend(model, SLOTS, CAP)
    vocab = model.config.vocab_size
    pre = _prefill(rng, SLOTS, 100, vocab)
    for trial in range(12):
        for be in (tb, nb):  # same cached past for both (torch also writes its padding positions)
            be.forward(pre)
        B, T = int(rng.integers(1, SLOTS + 1)), int(rng.integers(1, 20))
        batch = _batch(rng, B, T, vocab, 100, gated=trial % 2 == 1, mask_id=model.config.mask_token_id)
        o1, o2 = tb.forward(batch), nb.forward(batch)
        real = np.arange(T)[None] < batch.row_lens[:, None]
        np.testing.assert_allclose(o2.logits[0][real[0]], o1.logits[0][real[0]], atol=2e-4, rtol=1e-4)
        np.testing.assert_allclose(o2.top_probs[real], o1.top_probs[real], atol=1e-4)
        assert o2.top_probs.shape[-1] == 3 and (np.diff(o2.top_probs[real], axis=-1) <= 0).all()  # the candidates'
        # the kernel's log-sum-exp (logprobs) = the host's over its own logits (float32 lanes vs float64 sum)
        np.testing.assert_allclose(o2.lse[0][real[0]], [log_sum_exp(r) for r in o2.logits[0][real[0]]],
                                   rtol=1e-6, atol=1e-5)
        top2 = np.sort(o1.logits[0], -1)[..., -2:] if o1.logits is not None else None
        margin = (top2[:, 1] - top2[:, 0])[real[0]]
        clear = margin > 1e-3  # argmax may legitimately flip at a near-tie only
        assert (o2.argmax[0][real[0]] == o1.argmax[0][real[0]])[clear].all(), (name, trial)
        for b in range(B):  # the new tokens' values are written at past_len .. past_len + len
            s, p, n = batch.slots[b], batch.past_lens[b], batch.row_lens[b]
            for vt, vn in zip(tb.v_cache, nb.v_cache):
                np.testing.assert_allclose(vn[s, :, p:p + n].numpy(), vt[s, :, p:p + n].numpy(), atol=1e-4)


def test_log_sum_exp_counts_mask_even_where_it_dominates():
    """The draft softmax leaves MASK out; the log-sum-exp for log-probabilities adds its term back, stably when
    MASK's logit is the row's largest by far."""
    model = random_model(tiny_config(), seed=4)
    with torch.no_grad():
        model.diffusion_head.weight[model.config.mask_token_id] *= 400.0
    nb = NativeBackend(model, SLOTS, CAP)
    rng = np.random.default_rng(1)
    nb.forward(_prefill(rng, SLOTS, 20, model.config.vocab_size))
    batch = _batch(rng, 3, 6, model.config.vocab_size, 20, gated=False)
    batch.want_logits[:] = True
    out = nb.forward(batch)
    real = np.arange(6)[None] < batch.row_lens[:, None]
    rows = out.logits[real]
    assert (rows.argmax(-1) == model.config.mask_token_id).mean() > 0.5  # MASK dominates most rows
    np.testing.assert_allclose(out.lse[real], [log_sum_exp(r) for r in rows], rtol=1e-6, atol=1e-5)
    assert np.isfinite(out.lse[real]).all()


@pytest.mark.parametrize("compute", ["float32", "bfloat16"])
def test_last_only_prefill_is_bit_identical_to_the_full_rows(compute):
    """A last_only prefill runs the last layer's o_proj and MLP on each row's last token alone: its
    outputs are the full forward's at those positions, bit for bit, and its cache is the same."""
    model = random_model(tiny_config(), seed=4)
    rng = np.random.default_rng(5)
    B, T = 4, 37
    lens = np.array([37, 1, 20, 33])
    ids = rng.integers(0, model.config.vocab_size, (B, T))

    def prefill(last_only: bool) -> ForwardBatch:
        return ForwardBatch(slots=np.arange(B), past_lens=np.zeros(B, np.int64), input_ids=ids,
                            position_ids=np.tile(np.arange(T), (B, 1)),
                            intra_mask=np.tile(np.tri(T, dtype=bool), (B, 1, 1)),
                            draft_gate=np.zeros((B, T), np.float32), want_logits=np.ones(B, bool), row_lens=lens,
                            last_only=last_only)

    full_be, last_be = (NativeBackend(model, B, 64, compute_dtype=compute) for _ in range(2))
    full, last = full_be.forward(prefill(False)), last_be.forward(prefill(True))
    at = (np.arange(B), lens - 1)
    np.testing.assert_array_equal(last.logits[at], full.logits[at])
    np.testing.assert_array_equal(last.argmax[at], full.argmax[at])
    np.testing.assert_array_equal(last.top_probs[at], full.top_probs[at])
    for kf, kl in zip(full_be.k_cache + full_be.v_cache, last_be.k_cache + last_be.v_cache):
        assert torch.equal(kf, kl)


@pytest.mark.parametrize("compute", ["float32", "bfloat16"])
def test_one_long_prefill_equals_two_short_ones(compute):
    """A 300-token prompt in one forward (attention items of 16 queries; on AMX, two chunks of 256 rows)
    or in two of 150 (the second over a cached past): the same cache and the same last-token outputs,
    bit for bit."""
    model = random_model(tiny_config(), seed=6)
    ids = np.random.default_rng(7).integers(0, model.config.vocab_size, (1, 300))

    def chunk(start: int, n: int) -> ForwardBatch:
        return ForwardBatch(slots=np.zeros(1, np.int64), past_lens=np.array([start]), input_ids=ids[:, start:start + n],
                            position_ids=np.arange(start, start + n)[None], intra_mask=np.tri(n, dtype=bool)[None],
                            draft_gate=np.zeros((1, n), np.float32), want_logits=np.ones(1, bool), last_only=True)

    one, two = (NativeBackend(model, 1, 320, compute_dtype=compute) for _ in range(2))
    a = one.forward(chunk(0, 300))
    two.forward(chunk(0, 150))
    b = two.forward(chunk(150, 150))
    np.testing.assert_array_equal(a.logits[0, 299], b.logits[0, 149])
    for ca, cb in zip(one.k_cache + one.v_cache, two.k_cache + two.v_cache):
        assert torch.equal(ca, cb)


@pytest.mark.skipif(not has_embedded(), reason="embedded model missing")
@pytest.mark.parametrize("compute,kv", [("float32", "float32"), ("bfloat16", "float32"), ("float32", "bfloat16"),
                                        ("bfloat16", "bfloat16")])
def test_verify_rows_are_bit_identical_to_ar_steps(compute, kv):
    """A token's outputs do not depend on the batch: a verify row reproduces the AR steps exactly
    (in float32 and bf16 compute, with a float32 or a bf16 KV cache)."""
    _check_verify_rows_equal_ar_steps(compute, kv)


@pytest.mark.parametrize("compute,kv", [("float32", "float32"), ("bfloat16", "bfloat16")])
def test_short_rows_equal_themselves_beside_a_prompt(compute, kv):
    """Rows of up to 16 new tokens put their new keys in a panel inside their own attention items; a
    forward with a longer row builds every row's panels up front instead. A 9-token verify row and a
    decode step give the same bits either way: alone, and beside a 20-token prompt in one forward."""
    model = random_model(tiny_config(), seed=8)
    rng = np.random.default_rng(9)
    vocab = model.config.vocab_size
    nb = NativeBackend(model, 4, 96, compute_dtype=compute, kv_cache_dtype=kv)
    pre = _prefill(rng, 1, 30, vocab)
    nb.forward(pre)
    for dst in (1, 2):
        nb.copy_slot(0, dst, 30)
    tokens = rng.integers(0, vocab, 9)

    def rows(slot: int, n: int, prompt: np.ndarray | None) -> ForwardBatch:
        """Slot `slot`: the first n tokens as one causal row over the 30-token past, beside `prompt` in slot 3."""
        B, T = (1, n) if prompt is None else (2, max(n, len(prompt)))
        ids, pos = np.zeros((B, T), np.int64), np.zeros((B, T), np.int64)
        intra = np.zeros((B, T, T), bool)
        ids[0, :n], pos[0, :n], intra[0, :n, :n] = tokens[:n], 30 + np.arange(n), np.tri(n, dtype=bool)
        lens = [n]
        if prompt is not None:
            m = len(prompt)
            ids[1, :m], pos[1, :m], intra[1, :m, :m] = prompt, np.arange(m), np.tri(m, dtype=bool)
            lens.append(m)
        intra[:, np.arange(T), np.arange(T)] = True
        return ForwardBatch(slots=np.array([slot, 3][:B]), past_lens=np.array([30, 0][:B]), input_ids=ids,
                            position_ids=pos, intra_mask=intra, draft_gate=np.zeros((B, T), np.float32),
                            want_logits=np.ones(B, bool), row_lens=np.array(lens))

    prompt = rng.integers(0, vocab, 20)
    for n in (9, 1):
        alone = nb.forward(rows(1, n, None))
        beside = nb.forward(rows(2, n, prompt))
        np.testing.assert_array_equal(alone.logits[0, :n], beside.logits[0, :n])
        np.testing.assert_array_equal(alone.top_probs[0, :n], beside.top_probs[0, :n])
        for v in nb.v_cache:  # the rows wrote the same values
            assert torch.equal(v[1, :, 30:30 + n], v[2, :, 30:30 + n])


@pytest.mark.parametrize("compute", ["float32", "bfloat16"])
@pytest.mark.parametrize("lens", [(17,), (16, 1), (9, 8, 16), (11, 11, 11), (30, 20, 15), (8,) * 8 + (1,)])
def test_rows_equal_themselves_across_gemm_row_blocks(compute, lens):
    """The GEMM takes up to 32 rows as one block and splits more into blocks as even as they go (33 as 11 + 11 + 11,
    65 as 22 + 22 + 21): a row's outputs are the same bits whichever block its tokens fall in. Each causal row over a
    shared 12-token past, run alone, equals itself in one forward with the others (totals 16 to 65 tokens)."""
    model = random_model(tiny_config(), seed=5)
    rng = np.random.default_rng(6)
    vocab, B, T = model.config.vocab_size, len(lens), max(lens)
    nb = NativeBackend(model, 2 * B, 96, compute_dtype=compute, kv_cache_dtype=compute)
    nb.forward(_prefill(rng, 1, 12, vocab))
    for dst in range(1, 2 * B):
        nb.copy_slot(0, dst, 12)
    ids = rng.integers(0, vocab, (B, T))

    def rows(slots: list[int], which: list[int]) -> ForwardBatch:
        n = len(which)
        intra = np.zeros((n, T, T), bool)
        for r, i in enumerate(which):
            intra[r, :lens[i], :lens[i]] = np.tri(lens[i], dtype=bool)
        intra[:, np.arange(T), np.arange(T)] = True
        return ForwardBatch(slots=np.array(slots), past_lens=np.full(n, 12), input_ids=ids[which],
                            position_ids=np.tile(12 + np.arange(T), (n, 1)), intra_mask=intra,
                            draft_gate=np.zeros((n, T), np.float32), want_logits=np.ones(n, bool),
                            row_lens=np.array([lens[i] for i in which]))

    together = nb.forward(rows(list(range(B)), list(range(B))))
    for i, n in enumerate(lens):
        alone = nb.forward(rows([B + i], [i]))
        np.testing.assert_array_equal(alone.logits[0, :n], together.logits[i, :n])
        np.testing.assert_array_equal(alone.top_probs[0, :n], together.top_probs[i, :n])


@pytest.mark.skipif(not has_embedded(), reason="embedded model missing")
@pytest.mark.parametrize("amx", ["1", "0"])
def test_each_bf16_path_is_batch_invariant(amx, monkeypatch):
    """bf16 compute runs on AMX where the CPU and the kernel allow it, else on vdpbf16ps (or its
    emulation); RECGUIDE_NATIVE_AMX=0 keeps AMX off. Each path alone keeps verify rows (27 of them here:
    two AMX row tiles) equal to the AR steps bit for bit."""
    if amx == "1" and not native_build.load_native().amx_available():
        pytest.skip("no AMX on this CPU (the other case runs the path it has)")
    monkeypatch.setenv("RECGUIDE_NATIVE_AMX", amx)
    nb = _check_verify_rows_equal_ar_steps("bfloat16", "bfloat16")
    assert (nb.bf16_dot == "amx_bf16") == (amx == "1")


@pytest.mark.parametrize("hidden,inter,head_dim", [(48, 80, 16), (64, 128, 8)])
def test_amx_computes_what_the_dot_instruction_does(hidden, inter, head_dim, monkeypatch):
    """AMX and vdpbf16ps multiply the same bf16 values into float32 sums, in different orders: over one
    layer their logits agree to float32 rounding, whatever the padding of k to whole tiles and of the
    columns to whole panels (these widths are not multiples of 32). (Over several layers the two drift
    apart by bf16's precision: a different last bit of a sum can round an activation to the next bf16.)"""
    if not native_build.load_native().amx_available():
        pytest.skip("no AMX on this CPU")
    model = random_model(tiny_config(num_hidden_layers=1, hidden_size=hidden, intermediate_size=inter,
                                     head_dim=head_dim), seed=2)
    rng = np.random.default_rng(7)
    backends = []
    for amx in ("1", "0"):
        monkeypatch.setenv("RECGUIDE_NATIVE_AMX", amx)
        backends.append(NativeBackend(model, SLOTS, CAP, compute_dtype="bfloat16"))
    assert backends[0].bf16_dot == "amx_bf16" and backends[1].bf16_dot in ("avx512_bf16", "emulated")
    vocab = model.config.vocab_size
    pre = _prefill(rng, SLOTS, 60, vocab)
    batch = _batch(rng, SLOTS, 8, vocab, 60, gated=False)
    batch.want_logits[:] = True
    outs = []
    for be in backends:
        be.forward(pre)
        outs.append(be.forward(batch))
    real = np.arange(8)[None] < batch.row_lens[:, None]
    la, lb = outs[0].logits[real], outs[1].logits[real]
    assert not np.array_equal(la, lb)  # two paths, not one
    assert np.abs(la - lb).max() / np.abs(lb).max() < 1e-5


def _check_verify_rows_equal_ar_steps(compute: str, kv: str) -> NativeBackend:
    model = load_checkpoint(EMBEDDED).model
    rng = np.random.default_rng(3)
    nb = NativeBackend(model, 4, 400, compute_dtype=compute, kv_cache_dtype=kv)
    prompt = rng.integers(4, 4000, 150)
    pre = _prefill(rng, 1, 150, 4096)
    pre.input_ids[:] = prompt
    nb.copy_slot(0, 0, 0)
    nb.forward(pre)
    for dst in (1, 2, 3):
        nb.copy_slot(0, dst, 150)
    tokens = rng.integers(4, 4000, 9)
    ar = []
    for i, t in enumerate(tokens):  # slot 0: one AR step per token
        out = nb.forward(ForwardBatch(slots=np.array([0]), past_lens=np.array([150 + i]), input_ids=np.array([[t]]),
                                      position_ids=np.array([[150 + i]]), intra_mask=np.ones((1, 1, 1), bool),
                                      draft_gate=np.zeros((1, 1), np.float32), want_logits=np.array([True])))
        ar.append((out.argmax[0, 0], out.top_ids[0, 0], out.top_probs[0, 0], out.logits[0, 0]))
    # slots 1-3: the same 9 tokens as one verify row, next to rows of other lengths and a draft row
    T = 9
    intra = np.zeros((3, T, T), bool)
    intra[0] = np.tri(T, dtype=bool)
    intra[1, :4, :4] = np.tri(4, dtype=bool)
    intra[2, :5, :5] = True
    intra[:, np.arange(T), np.arange(T)] = True
    ids = np.stack([tokens, rng.integers(4, 4000, T), np.full(T, 3)])
    gate = np.zeros((3, T), np.float32)
    gate[2, 1:5] = 1.0
    out = nb.forward(ForwardBatch(slots=np.array([1, 2, 3]), past_lens=np.array([150, 150, 150]), input_ids=ids,
                                  position_ids=np.tile(150 + np.arange(T), (3, 1)), intra_mask=intra, draft_gate=gate,
                                  want_logits=np.ones(3, bool), row_lens=np.array([9, 4, 5])))
    for i, (am, ti, tp, lg) in enumerate(ar):
        assert out.argmax[0, i] == am
        np.testing.assert_array_equal(out.top_ids[0, i], ti)
        np.testing.assert_array_equal(out.top_probs[0, i], tp)
        np.testing.assert_array_equal(out.logits[0, i], lg)
    kv_ar = [v[0, :, 150:159].clone() for v in nb.v_cache]
    kv_verify = [v[1, :, 150:159] for v in nb.v_cache]
    for a, b in zip(kv_ar, kv_verify):
        assert torch.equal(a, b)
    return nb


@pytest.mark.skipif(not has_embedded(), reason="embedded model missing")
@pytest.mark.parametrize("compute", ["float32", "bfloat16", "bfloat16+kv"])
@pytest.mark.parametrize("policy,block", [("linearspec", 4), ("linearspec", 8), ("linearspec", 16), ("recguide", None)])
def test_policies_equal_native_ar_exactly(policy, block, compute):
    """Lossless without tolerance: on the native backend every policy's greedy output is the AR output
    of the same arithmetic (bf16 compute, and bf16 compute with a bf16 KV cache, against their own AR)."""
    llm = _native_llm(compute)
    rng = np.random.default_rng(7)
    prompts = [[int(t) for t in rng.integers(4, 4000, int(n))] for n in rng.integers(5, 200, 24)]
    ar = llm.generate(prompts, SamplingParams(max_tokens=40, policy="ar", stop_at_eos=False))
    got = llm.generate(prompts, SamplingParams(max_tokens=40, policy=policy, block_size=block, stop_at_eos=False))
    assert [o.token_ids for o in got] == [o.token_ids for o in ar]
    assert sum(o.metrics.accepted_draft_tokens for o in got) > 0


_LLM: dict = {}


def _native_llm(compute: str = "float32") -> LLM:
    if compute not in _LLM:
        from tests.runtime.helpers import flat_cost_table

        _LLM[compute] = LLM(EMBEDDED, backend="native", compute_dtype=compute.split("+")[0],
                            kv_cache_dtype="bfloat16" if compute.endswith("+kv") else None,
                            engine_config=EngineConfig(max_num_seqs=8, max_model_len=400, cost_table=flat_cost_table()))
    return _LLM[compute]


@pytest.mark.parametrize("name,model", _models(), ids=lambda v: v if isinstance(v, str) else "")
def test_bf16_compute_stays_close_to_float32(name, model):
    """bf16 compute rounds activations and weights to bf16 before each product: logits move by about
    bf16's precision, the argmax only where the top two are close, and the KV cache stays float32."""
    rng = np.random.default_rng(5)
    f32, bf = NativeBackend(model, SLOTS, CAP), NativeBackend(model, SLOTS, CAP, compute_dtype="bfloat16")
    assert bf.compute_dtype == "bfloat16" and bf.bf16_dot in ("amx_bf16", "avx512_bf16", "emulated")
    vocab = model.config.vocab_size
    pre = _prefill(rng, SLOTS, 60, vocab)
    for be in (f32, bf):
        be.forward(pre)
    batch = _batch(rng, SLOTS, 8, vocab, 60, gated=True, mask_id=model.config.mask_token_id)
    batch.want_logits[:] = True
    a, b = f32.forward(batch), bf.forward(batch)
    real = np.arange(8)[None] < batch.row_lens[:, None]
    la, lb = a.logits[real], b.logits[real]
    scale = np.abs(la).max(-1, keepdims=True) + 1e-6
    assert np.abs(lb - la).max() / scale.max() < 0.05
    assert not np.array_equal(la, lb)  # it does compute in bf16
    top2 = np.sort(la, -1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 0.1 * scale[:, 0]
    assert (a.argmax[real] == b.argmax[real])[clear].all()
    assert all(v.dtype == torch.float32 for v in bf.v_cache)


def test_bf16_kv_cache_holds_the_rounded_values():
    """kv_cache_dtype="bfloat16": the cache is bf16 (half the bytes), and holds the float32 cache's
    values rounded to bf16 (within bf16's precision of them)."""
    model = random_model(tiny_config(), seed=6)
    f32, bkv = NativeBackend(model, 2, 64), NativeBackend(model, 2, 64, kv_cache_dtype="bfloat16")
    pre = _prefill(np.random.default_rng(2), 2, 30, model.config.vocab_size)
    pre.want_logits[:] = True
    a, b = f32.forward(pre), bkv.forward(pre)
    assert all(k.dtype == torch.bfloat16 for k in bkv.k_cache) and all(v.dtype == torch.bfloat16 for v in bkv.v_cache)
    assert bkv.v_cache[0].element_size() * 2 == f32.v_cache[0].element_size()
    v32, v16 = f32.v_cache[0][:, :, :30].float(), bkv.v_cache[0][:, :, :30].float()
    assert torch.allclose(v16, v32, rtol=2 ** -7, atol=1e-6)  # layer 0's values: rounded, nothing else
    np.testing.assert_allclose(b.logits, a.logits, atol=0.05 * np.abs(a.logits).max())


def test_copy_slot_moves_the_cache():
    model = random_model(tiny_config(), seed=4)
    nb = NativeBackend(model, 3, 64)
    rng = np.random.default_rng(1)
    pre = _prefill(rng, 1, 20, 96)
    nb.forward(pre)
    nb.copy_slot(0, 2, 20)
    step = dict(past_lens=np.array([20]), input_ids=np.array([[5]]), position_ids=np.array([[20]]),
                intra_mask=np.ones((1, 1, 1), bool), draft_gate=np.zeros((1, 1), np.float32),
                want_logits=np.array([True]))
    a = nb.forward(ForwardBatch(slots=np.array([0]), **step))
    b = nb.forward(ForwardBatch(slots=np.array([2]), **step))
    np.testing.assert_array_equal(a.logits, b.logits)


def test_bf16_weights_run_as_stored():
    """A bf16 model packs as it is stored and computes exactly what its float32 widening computes."""
    import copy

    model = random_model(tiny_config(), seed=3)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    f32, bf16 = NativeBackend(model, 2, 64), NativeBackend(copy.deepcopy(model).to(torch.bfloat16), 2, 64)
    batch = _prefill(np.random.default_rng(1), 2, 20, model.config.vocab_size)
    batch.want_logits[:] = True
    a, b = f32.forward(batch), bf16.forward(batch)
    assert np.array_equal(a.logits, b.logits) and np.array_equal(a.argmax, b.argmax)


@pytest.mark.skipif(not has_embedded(), reason="embedded model missing")
def test_llm_holds_bf16_weights_until_the_torch_model_is_asked_for():
    llm = LLM("tiny", max_num_seqs=2)
    assert llm._checkpoint.model.encoder.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    first = llm.generate(["def f(x):"], SamplingParams(max_tokens=12, policy="ar"))[0].token_ids
    assert llm.checkpoint.model.encoder.layers[0].mlp.up_proj.weight.dtype == torch.float32  # widened on access
    assert llm.generate(["def f(x):"], SamplingParams(max_tokens=12, policy="ar"))[0].token_ids == first


@pytest.mark.skipif(not has_embedded(), reason="embedded model missing")
def test_step_cost_tables_are_keyed_by_the_kernel_build(tmp_path):
    """A cached step-cost table prices forwards of the kernel it was measured on: the engine's key names
    the build (and the bf16 path), so a changed kernel source re-measures instead of reusing it."""
    llm = LLM("tiny", max_num_seqs=2, compute_dtype="bfloat16")
    key = llm.engine._cost_key
    assert key["kernel"] == native_build.build_key(native_build.SOURCE) == llm.backend.kernel
    assert key["bf16_dot"] == llm.backend.bf16_dot
    assert "bf16_dot" not in LLM("tiny", max_num_seqs=2).engine._cost_key
    edited = tmp_path / "nld_cpu.cpp"
    edited.write_bytes(native_build.SOURCE.read_bytes() + b"\n// an edit\n")
    assert native_build.build_key(edited) != key["kernel"]


def test_rejects_what_it_cannot_run():
    model = random_model(tiny_config(), seed=0)
    with pytest.raises(ValueError, match="compute_dtype='float16'"):
        NativeBackend(model, 2, 32, compute_dtype="float16")
    with pytest.raises(ValueError, match="compute_dtype='int8'"):
        LLM("tiny", compute_dtype="int8")
    with pytest.raises(ValueError, match="native backend's option"):
        LLM("tiny", backend="torch", compute_dtype="bfloat16")
    with pytest.raises(ValueError, match="kv_cache_dtype='fp8'"):
        NativeBackend(model, 2, 32, kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match="kv_cache_dtype='bfloat16' is the native backend's option"):
        LLM("tiny", backend="torch", kv_cache_dtype="bfloat16")
    with pytest.raises(ValueError, match="float32 or bfloat16 weights"):
        NativeBackend(model.to(torch.float16), 2, 32)
    with pytest.raises(ValueError, match="native backend runs on the CPU"):
        LLM("tiny", backend="native", device="cuda")
    nb = NativeBackend(random_model(tiny_config(), seed=0), 2, 32)
    bad = _prefill(np.random.default_rng(0), 1, 40, 96)
    with pytest.raises(ValueError, match="slot capacity"):
        nb.forward(bad)
    tb = TorchBackend(random_model(tiny_config(), seed=0), 2, 32)
    for bad_id in (96, -1):  # the kernel would read past the embedding table; torch's embedding would raise deep inside
        bad = _prefill(np.random.default_rng(0), 1, 8, 96)
        bad.input_ids[0, 3] = bad_id
        for backend in (nb, tb):
            with pytest.raises(ValueError, match=r"input_ids must be in \[0, 96\)"):
                backend.forward(bad)


def test_default_backend():
    assert default_backend("cpu", None) == "native"
    assert default_backend("cpu", "bfloat16") == "torch"
    assert default_backend("cuda", None) == "torch"
    if has_embedded():
        assert LLM("tiny", max_num_seqs=2).backend_name == "native"


def test_build_failure_names_the_source(tmp_path, monkeypatch):
    broken = tmp_path / "nld_cpu.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setenv("RECGUIDE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(native_build.NativeBuildError, match="could not build the native CPU backend from"):
        native_build.load_native(broken)


def test_vector_exp_paths_equal_the_scalar_one():
    """Softmax and SwiGLU take vexp on whole vectors (vector builds: the hand-written vexp_lanes, 8 lanes on AVX2, 16 on AVX-512): their
    results equal vexp's one element at a time bit for bit, special values and clamp edges included, and
    stay within a few ulps of exp where exp is a normal float."""
    rng = np.random.default_rng(0)
    special = [0.0, -0.0, 1.0, -1.0, 88.3762626647949, 88.38, 89.0, -87.3365478515625, -87.34, -88.0, -103.0,
               float("inf"), float("-inf"), float("nan"), 1e-30, -1e-30, 3.4e38, -3.4e38]
    bits = np.arange(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32)  # a stride of patterns
    x = torch.from_numpy(np.concatenate([np.array(special * 9, np.float32), bits,
                                         rng.normal(0, 30, 100_003).astype(np.float32)]))
    e, e_one, s, s_one = native_build.load_native().exp_paths(x)
    for vec, one in ((e, e_one), (s, s_one)):
        same = (vec.view(torch.int32) == one.view(torch.int32)) | (vec.isnan() & one.isnan())
        assert bool(same.all()), x[~same][:8]
    normal = (x > -80) & (x < 80)
    ref = torch.exp(x[normal].double())
    assert float(((e[normal].double() - ref).abs() / ref).max()) < 4e-7
    with pytest.raises(RuntimeError, match="exp_paths: a 1-D float32 tensor"):
        native_build.load_native().exp_paths(torch.zeros(2, 2))


@pytest.mark.parametrize("n", [49_152, 49_159, 16, 7, 1])
def test_head_exp_sum_is_its_16_lane_definition(n):
    """The head's softmax sum (the top-2 probabilities): 16 lanes of vexp in index order and a fixed tree,
    MASK left out, whatever the vector path; a mis-ordered or mis-skipped lane changes the bits."""
    rng = np.random.default_rng(n)
    x = torch.from_numpy(rng.normal(0, 4, n).astype(np.float32))
    m = float(x.max())
    paths = native_build.load_native().exp_sum_paths
    for skip in sorted({-1, 0, n - 1, n // 2, min(n - 1, 17)}):
        xs = x.clone()
        if skip >= 0:
            xs[skip] = m  # a skipped element that counted would add exactly 1
        vec, definition = paths(xs, m, skip)
        assert vec == definition, (skip, vec, definition)
        ref = np.exp(np.delete(xs.double().numpy(), skip) - m).sum() if skip >= 0 else np.exp(xs.double().numpy() - m).sum()
        assert abs(vec - ref) <= 1e-5 * ref, (skip, vec, ref)



def thread_count_outputs(out: str) -> None:
    """Run by the test below in a fresh process (the native pool is sized once per process, by its first
    model): forwards of prefill, block, draft and batch shapes in float32 and bf16 compute, their outputs
    and the KV values saved."""
    model = load_checkpoint(EMBEDDED).model
    vocab, arrays = model.config.vocab_size, {}
    for compute in ("float32", "bfloat16"):
        nb = NativeBackend(model, SLOTS, CAP, compute_dtype=compute)
        rng = np.random.default_rng(5)
        outs = [nb.forward(_prefill(rng, SLOTS, 100, vocab))]
        for B, T, gated in ((1, 1, False), (1, 8, True), (1, 16, False), (SLOTS, 1, False), (SLOTS, 9, True)):
            batch = _batch(rng, B, T, vocab, 100, gated=gated, mask_id=model.config.mask_token_id)
            batch.want_logits[:] = True
            outs.append(nb.forward(batch))
        arrays.update({f"{compute}-{i}-{field}": getattr(o, field) for i, o in enumerate(outs)
                       for field in ("argmax", "top_ids", "top_probs", "logits") if getattr(o, field) is not None})
        arrays.update({f"{compute}-v{i}": v.numpy() for i, v in enumerate(nb.v_cache)})
    np.savez(out, threads=torch.get_num_threads(), **arrays)


@pytest.mark.skipif(not has_embedded(), reason="embedded model missing")
def test_outputs_do_not_depend_on_the_thread_count(tmp_path):
    """Each output is one chain on one thread, so 1, 2 and 3 threads give bit-identical logits, top-k and
    KV values, in float32 and bf16 compute. Each count runs in its own process: the pool is sized once per
    process. The suite's workers run at one thread each (run_tests.sh), so this is where the pool's splits
    are exercised."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    runs = []
    for threads in (1, 2, 3):
        out = tmp_path / f"t{threads}.npz"
        code = ("import torch, sys; torch.set_num_threads(int(sys.argv[1])); "
                "from tests.backends.test_native_backend import thread_count_outputs as f; f(sys.argv[2])")
        res = subprocess.run([sys.executable, "-c", code, str(threads), str(out)], cwd=root, capture_output=True,
                             text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
        assert res.returncode == 0, res.stderr[-2000:]
        runs.append(dict(np.load(out)))
    assert [int(r.pop("threads")) for r in runs] == [1, 2, 3]
    for r in runs[1:]:
        assert r.keys() == runs[0].keys()
        for key, value in runs[0].items():
            np.testing.assert_array_equal(r[key], value, err_msg=key)


@pytest.mark.parametrize("compute", ["float32", "bfloat16"])
def test_a_fused_rows_verify_tokens_are_a_plain_verify(compute):
    """The draft adapter's product goes to draft-gated tokens only: in a fused row (T verify tokens, then
    the prospective draft block), the verify tokens' logits equal those of a plain verify forward of the
    same tokens over the same past, bit for bit, while the draft tokens carry the adapter."""
    from recguide_trt.model import masks

    model = random_model(tiny_config(), seed=5)
    model.attach_draft_adapter(4, 8.0, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    model.eval()
    cfg = model.config
    rng = np.random.default_rng(6)
    past, T, shared = 30, 6, 3
    prompt = rng.integers(0, cfg.vocab_size, (1, past))

    def backend_with_past() -> NativeBackend:  # the same past in both slots
        be = NativeBackend(model, 2, CAP, compute_dtype=compute, kv_cache_dtype=compute)
        for slot in (0, 1):
            be.forward(ForwardBatch(slots=np.array([slot]), past_lens=np.zeros(1, np.int64), input_ids=prompt,
                                    position_ids=np.arange(past)[None], intra_mask=np.tri(past, dtype=bool)[None],
                                    draft_gate=np.zeros((1, past), np.float32), want_logits=np.zeros(1, bool),
                                    row_lens=np.full(1, past)))
        return be

    be = backend_with_past()
    tokens = rng.integers(0, cfg.vocab_size, T)
    ids = np.concatenate([tokens, [tokens[shared]], np.full(T - 1, cfg.mask_token_id)])[None]
    fused = ForwardBatch(slots=np.array([0]), past_lens=np.full(1, past, np.int64), input_ids=ids,
                         position_ids=np.concatenate([past + np.arange(T), past + shared + np.arange(T)])[None],
                         intra_mask=masks.fused_rows(T, shared, T, cfg.draft_seed_causal)[None],
                         draft_gate=np.concatenate([np.zeros(T, np.float32),
                                                    masks.draft_gate(T, cfg.draft_seed_causal)])[None],
                         want_logits=np.ones(1, bool), row_lens=np.full(1, 2 * T))
    verify = ForwardBatch(slots=np.array([1]), past_lens=np.full(1, past, np.int64), input_ids=ids[:, :T],
                          position_ids=fused.position_ids[:, :T], intra_mask=np.tri(T, dtype=bool)[None],
                          draft_gate=np.zeros((1, T), np.float32), want_logits=np.ones(1, bool),
                          row_lens=np.full(1, T))
    a, b = be.forward(fused), be.forward(verify)
    np.testing.assert_array_equal(a.logits[0, :T].view(np.uint32), b.logits[0, :T].view(np.uint32))
    off = backend_with_past()
    ungated = dataclasses.replace(fused, draft_gate=np.zeros_like(fused.draft_gate))
    c = off.forward(ungated)
    assert not np.array_equal(a.logits[0, T:], c.logits[0, T:])  # the draft tokens do see the adapter
