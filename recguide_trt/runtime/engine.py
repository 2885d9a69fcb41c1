"""The serving core: admission, continuous batching and the step loop.

Each step: take new submissions and cancellations, admit waiting requests while the KV budget
allows, ask each request's policy for its plan (plain data), pack the plans into one ragged
forward (prompts in a separate prefill forward), accept, update the KV lengths, stream tokens and
retire finished requests. Thread-safe ``submit``/``cancel``; ``step`` runs on one thread.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..model.config import NLDConfig
from ..model.draft_sampler import DraftSampler
from .cost_model import DEFAULT_TOKENS, CostTable, cached_cost_table
from .cost_refit import RefittedCostTable
from .executor import Decision, Executor
from .logits_processors import stop_ids
from .mismatch import NO_MISMATCH
from .nvtx_ranges import trace_range
from .params import PEER_CONTROLLERS, SamplingParams
from .plan import Kind, Work
from .policies.ar import ARPolicy
from .policies.base import StepContext
from .policies.linearspec import LinearSpecPolicy
from .policies.lookup import PromptLookupPolicy
from .policies.recguide import RecGuideConfig, RecGuidePolicy
from .policies.sglang_adaptive import SglangAdaptiveConfig, SglangAdaptivePolicy
from .policies.sglang_autospec import SglangAutospecConfig, SglangAutospecPolicy
from .policies.trtllm_schedule import TrtllmScheduleConfig, TrtllmSchedulePolicy
from .policies.vllm_adaptive_k import VllmAdaptiveKConfig, VllmAdaptiveKPolicy
from .prefix_cache import PrefixCache, starts_with, tokens_array
from .request import Draft, Request, Round, Status


@dataclass
class EngineConfig:
    """Capacity and policy settings of one engine."""

    max_num_seqs: int = 64
    """Requests decoded concurrently at most (KV-cache slots)."""
    max_model_len: int = 1024
    """Prompt + output tokens of one request at most."""
    max_block_size: int | None = None
    """Largest draft block any policy may use (None: twice the model's block size, at most 32)."""
    kv_budget_tokens: int | None = None
    """KV-cache tokens that admitted requests may reserve in total (None: all slots' capacity)."""
    recguide: RecGuideConfig = field(default_factory=RecGuideConfig)
    """RecGuide policy knobs."""
    trtllm_schedule: TrtllmScheduleConfig = field(default_factory=TrtllmScheduleConfig)
    """Knobs of the "trtllm-schedule" peer controller (TensorRT-LLM's draft_len_schedule and gate)."""
    sglang_adaptive: SglangAdaptiveConfig = field(default_factory=SglangAdaptiveConfig)
    """Knobs of the "sglang-adaptive" peer controller (SGLang --speculative-adaptive)."""
    sglang_autospec: SglangAutospecConfig = field(default_factory=SglangAutospecConfig)
    """Knobs of the "sglang-autospec" peer controller (SGLang --auto-spec)."""
    vllm_adaptive_k: VllmAdaptiveKConfig = field(default_factory=VllmAdaptiveKConfig)
    """Knobs of the "vllm-adaptive-k" peer controller (vLLM enable_adaptive_k)."""
    cost_table: CostTable | None = None
    """Step-cost table for RecGuide; None measures one on the backend at first use (cached on disk)."""
    cost_refit: bool = True
    """Refine the measured start-up table online from the decode steps' own forward times
    (:mod:`.cost_refit`); a table passed in ``cost_table`` is always used as given."""
    cost_past_len: int = 128
    """Cached-prefix length the start-up cost table is measured at (clipped to the cache). Attention
    over the prefix changes the relative cost of wide rows as contexts grow: set it near the served
    workload's typical context."""
    seed: int = 0
    """Seeds the generators of sampling requests that bring no seed of their own."""
    prefix_cache: bool = True
    """Reuse the K/V of a prompt prefix that a slot already holds (a shared system prompt, earlier chat
    turns, a repeated prompt) instead of prefilling it again (:mod:`.prefix_cache`). Outputs are unchanged:
    bit-identical on the native backend. Benchmarks that replay prompts turn it off, so that every run
    pays its own prefill."""
    prefix_cache_slots: int = 0
    """KV slots beyond ``max_num_seqs`` that hold cached prefixes only; each costs one slot's KV memory
    (``max_model_len`` + 2 · ``max_block_size`` tokens). 0: the cache keeps what the free slots of ``max_num_seqs``
    hold, as many prompts as there are idle slots."""
    draft_sampler: bool = True
    """Choose greedy draft tokens with the adapter's draft sampler where the model has one
    (:mod:`recguide_trt.model.draft_sampler`): each knows the token drafted before it. Outputs are unchanged
    (verification decides them); only acceptance moves. False drafts each position's own top token."""

    def validate(self) -> None:
        """A ValueError naming the field for any setting the engine cannot run with."""
        def integer(name: str, minimum: int, optional: bool = False) -> None:
            v = getattr(self, name)
            if optional and v is None:
                return
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum:
                raise ValueError(f"{name} must be an integer >= {minimum}{' or None' if optional else ''}, got {v!r}")
            setattr(self, name, int(v))

        integer("max_num_seqs", 1)
        integer("max_model_len", 2)
        integer("max_block_size", 2, optional=True)
        integer("kv_budget_tokens", 1, optional=True)
        integer("cost_past_len", 1)
        integer("prefix_cache_slots", 0)
        integer("seed", 0)
        for name, kind in (("recguide", RecGuideConfig), ("trtllm_schedule", TrtllmScheduleConfig),
                           ("sglang_adaptive", SglangAdaptiveConfig), ("sglang_autospec", SglangAutospecConfig),
                           ("vllm_adaptive_k", VllmAdaptiveKConfig)):
            if not isinstance(getattr(self, name), kind):
                raise ValueError(f"{name} must be a {kind.__name__}, got {type(getattr(self, name)).__name__}")
        for name in ("cost_refit", "prefix_cache", "draft_sampler"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.prefix_cache_slots and not self.prefix_cache:
            raise ValueError(f"prefix_cache_slots={self.prefix_cache_slots} needs prefix_cache=True")
        if self.cost_table is not None and not isinstance(self.cost_table, CostTable):
            raise ValueError(f"cost_table must be a CostTable or None, got {type(self.cost_table).__name__}")


class Engine:
    def __init__(self, backend, config: NLDConfig, engine_config: EngineConfig | None = None,
                 cost_key: dict | None = None, clock: Callable[[], float] | None = None,
                 draft_sampler: DraftSampler | None = None):
        """``draft_sampler``: the model's (:class:`~recguide_trt.model.draft_sampler.DraftSampler`), used unless
        ``engine_config.draft_sampler`` is False."""
        self.backend = backend
        self.clock = clock or time.perf_counter
        """Where every time the engine records comes from (request timestamps, phase timers, the
        forward times the cost refit learns from). The simulator passes a virtual clock that its
        simulated backend advances by each forward's modelled cost."""
        self.model_config = config
        self.config = ec = engine_config or EngineConfig()
        ec.validate()
        self.max_block = ec.max_block_size or min(32, 2 * config.block_size)
        if self.max_block < 2:
            raise ValueError(f"max_block_size must be >= 2, got {self.max_block}")
        if ec.cost_past_len < 1:
            raise ValueError(f"cost_past_len must be >= 1, got {ec.cost_past_len}")
        self.scratch = 2 * self.max_block
        if backend.slot_capacity < ec.max_model_len + self.scratch or backend.max_slots < ec.max_num_seqs:
            raise ValueError("backend cache is smaller than the engine configuration needs")
        if backend.max_slots < ec.max_num_seqs + ec.prefix_cache_slots:
            raise ValueError(f"the backend has {backend.max_slots} KV slots; max_num_seqs {ec.max_num_seqs} + "
                             f"prefix_cache_slots {ec.prefix_cache_slots} need {ec.max_num_seqs + ec.prefix_cache_slots}")
        backend_block = getattr(backend, "max_draft_tokens", None)
        if backend_block is not None and self.max_block > backend_block:
            raise ValueError(f"max_block_size {self.max_block} exceeds the backend's draft profile (tokens <= "
                             f"{backend_block}); lower max_block_size or re-export with a larger max_block")
        self.kv_budget = ec.kv_budget_tokens or ec.max_num_seqs * (ec.max_model_len + self.scratch)
        self.executor = Executor(backend, config.mask_token_id, config.eos_token_id, ec.recguide.tau,
                                 config.draft_seed_causal, ec.recguide.flag_rule, config.extra_eos_token_ids,
                                 draft_sampler if ec.draft_sampler else None)
        self.policies = {
            "ar": ARPolicy(),
            "linearspec": LinearSpecPolicy(min(config.block_size, self.max_block)),
            "lookup": PromptLookupPolicy(min(config.block_size, self.max_block)),
            "recguide": RecGuidePolicy(ec.recguide, self.max_block, config.mask_token_id, ec.cost_table,
                                       ec.max_num_seqs),
            "trtllm-schedule": TrtllmSchedulePolicy(ec.trtllm_schedule, self.max_block),
            "sglang-adaptive": SglangAdaptivePolicy(ec.sglang_adaptive, self.max_block),
            "sglang-autospec": SglangAutospecPolicy(ec.sglang_autospec, self.max_block),
            "vllm-adaptive-k": VllmAdaptiveKPolicy(ec.vllm_adaptive_k, self.max_block),
        }
        self.policies["recguide"].packed = bool(getattr(backend, "packs_rows", False))
        self._costed = {name for name, p in self.policies.items() if getattr(p, "needs_cost", False)}
        """Policies that price steps with the start-up cost table (RecGuide and the peers that need it)."""
        for name in self._costed - {"recguide"}:
            self.policies[name].cost = ec.cost_table
        self._cost_key = cost_key or {}
        self._stream_executor = None
        self._lock = threading.Lock()
        self._inbox: list[Request] = []
        self._cancels: set[int] = set()
        self._next_id = 0
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._free_slots = list(range(ec.max_num_seqs + ec.prefix_cache_slots))
        self._reserved = 0
        self._seed_rng = np.random.default_rng(ec.seed)
        self.prefix_cache = PrefixCache() if ec.prefix_cache and getattr(backend, "kv_reusable", True) else None
        """Which free slots still hold whose K/V (None: off, or a backend that keeps no K/V)."""
        self._prompts: dict[int, np.ndarray] = {}
        """Running requests' prompts as arrays, by request id (the prefix cache's sources)."""
        self._compacts = not getattr(backend, "reads_slots_in_place", False)
        """Move running requests into slots 0 … n-1 as others retire (:meth:`_compact`). A backend whose
        attention reads each row's slot where it is (the native one) needs no moves: they would cost copies
        and overwrite free slots' cached prefixes."""
        self.steps = 0
        self.time_step = 0.0
        self.phase_times: Counter = Counter()
        """Seconds per step phase (schedule, plan, pack, forward, accept, emit, retire): the host's
        share of a step next to the backend's, for ``scripts/profile_breakdown.py``."""
        self.concurrency_hist: Counter = Counter()
        self.blocks_by_concurrency: dict[int, Counter] = defaultdict(Counter)

    # -- submission (any thread) ---------------------------------------------------------------
    def check(self, prompt_ids: list[int], params: SamplingParams) -> None:
        params.validate()
        if not prompt_ids:
            raise ValueError("prompt is empty: give at least one token of text")
        if any((not isinstance(t, (int, np.integer))) or not 0 <= t < self.model_config.vocab_size
               for t in prompt_ids):
            raise ValueError(f"prompt token ids must be integers in [0, {self.model_config.vocab_size})")
        limit = self.config.max_model_len
        if len(prompt_ids) >= limit:
            raise ValueError(f"prompt has {len(prompt_ids)} tokens; the context window (max_model_len) is {limit}: "
                             f"shorten the prompt")
        if len(prompt_ids) + params.max_tokens > limit:
            raise ValueError(f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) exceeds "
                             f"max_model_len {limit}: lower max_tokens to at most {limit - len(prompt_ids)}")
        prefill_limit = getattr(self.backend, "max_prefill_tokens", None)
        if prefill_limit is not None and len(prompt_ids) > prefill_limit:
            raise ValueError(f"prompt has {len(prompt_ids)} tokens; the backend's prefill profile takes tokens in "
                             f"[1, {prefill_limit}]: shorten the prompt")
        vocab = self.model_config.vocab_size
        for name, ids in (("stop_token_ids", params.stop_token_ids), ("logit_bias", params.logit_bias)):
            if any(t >= vocab for t in ids):
                raise ValueError(f"{name} token ids must be integers in [0, {vocab}), got {max(ids)}")
        if params.block_size is not None and params.block_size > self.max_block:
            raise ValueError(f"block_size {params.block_size} exceeds the engine's max_block_size {self.max_block}")

    def submit(self, prompt_ids: list[int], params: SamplingParams, on_tokens=None) -> Request:
        self.check(prompt_ids, params)
        with self._lock:
            rid = self._next_id
            self._next_id += 1
            seed = params.seed if params.seed is not None else int(self._seed_rng.integers(2**63))
            req = Request(rid, [int(t) for t in prompt_ids], params, np.random.default_rng(seed), on_tokens)
            req.reserved_tokens = len(prompt_ids) + params.max_tokens + self.scratch
            req.metrics.arrival = self.clock()
            req.metrics.prompt_tokens = len(prompt_ids)
            self._inbox.append(req)
        return req

    def cancel(self, request_id: int) -> None:
        with self._lock:
            self._cancels.add(request_id)

    def has_work(self) -> bool:
        with self._lock:
            return bool(self._inbox or self.waiting or self.running or self._cancels)

    # -- the step loop (one thread) ------------------------------------------------------------
    def step(self) -> None:
        t0 = self.clock()
        with trace_range("schedule"):
            self._drain_inbox()
            self._ensure_cost_table()
            self._admit()
        self.phase_times["schedule"] += self.clock() - t0
        if not self.running:
            return
        C = len(self.running)
        self.concurrency_hist[C] += 1
        ctx = StepContext(concurrency=C, step=self.steps)
        self.steps += 1
        prefill = [r for r in self.running if r.seed is None]
        decode = [r for r in self.running if r.seed is not None]
        rows = getattr(self.backend, "max_prefill_rows", None) or max(1, len(prefill))
        for i in range(0, len(prefill), rows):
            chunk = prefill[i:i + rows]
            self._run([Work(r.id, Kind.PREFILL) for r in chunk], chunk, "prefill")
        if decode:
            t_plan = self.clock()
            with trace_range("schedule"):
                works = self._plan(decode, ctx)
            self.phase_times["plan"] += self.clock() - t_plan
            for w in works:
                if w.kind in (Kind.AR, Kind.DRAFT):
                    self.blocks_by_concurrency[C][w.block] += 1
            self._run(works, decode, "decode")
        t_retire = self.clock()
        self._retire()
        now = self.clock()
        self.phase_times["retire"] += now - t_retire
        self.time_step += now - t0

    def run_until_done(self) -> None:
        while self.has_work():
            self.step()

    def _plan(self, decode: list[Request], ctx: StepContext) -> list[Work]:
        by_policy: dict[str, list[int]] = defaultdict(list)
        for i, r in enumerate(decode):
            by_policy[r.params.policy].append(i)
        works: list[Work | None] = [None] * len(decode)
        for name, idx in by_policy.items():
            for i, w in zip(idx, self.policies[name].plan([decode[i] for i in idx], ctx)):
                works[i] = w
                if w.lookup:  # a draft found in the context: verified as if drafted (no flag: no bet on it)
                    decode[i].draft = Draft(list(w.lookup), NO_MISMATCH, lookup=True)
        return works  # type: ignore[return-value]

    def _run(self, works: list[Work], reqs: list[Request], label: str) -> None:
        kinds = {w.kind for w in works}
        name = "fused" if Kind.FUSED in kinds else ("verify" if Kind.VERIFY in kinds else
                                                   ("draft" if Kind.DRAFT in kinds else label))
        try:
            t_pack = self.clock()
            batch = self.executor.pack(works, reqs)
            t0 = self.clock()
            self.phase_times["pack"] += t0 - t_pack
            streams = Kind.FUSED in kinds and self.config.recguide.overlap == "streams"
            if streams:
                out = self._run_streams(batch, works, reqs)
            else:
                with trace_range(name):
                    out = self.backend.forward(batch)
            seconds = self.clock() - t0
            self.phase_times["forward"] += seconds
        except Exception as exc:
            for r in reqs:
                self._fail(r, f"forward failed: {exc!r}")
            return
        with trace_range("accept"):
            t_accept = self.clock()
            decisions = self.executor.decide(works, reqs, out)
            now = self.clock()
            self.phase_times["accept"] += now - t_accept
            for w, r, d in zip(works, reqs, decisions):
                if isinstance(d, Exception):
                    self._fail(r, f"{type(d).__name__}: {d}")
                    continue
                try:
                    self._apply(w, r, d, now)
                except Exception as exc:
                    self._fail(r, f"{type(exc).__name__}: {exc}")
            end = self.clock()
            self.phase_times["emit"] += end - now
        cost = self.policies["recguide"].cost
        if label == "decode" and not streams and isinstance(cost, RefittedCostTable):
            B, T = np.shape(batch.input_ids)
            adapter = bool(batch.draft_gate.any())
            # The host work of every decode step prices RecGuide's steps (whatever policy ran it:
            # the packing and acceptance code is the same); the forward refit learns from RecGuide's
            # own forwards only (other policies' traffic is theirs).
            cost.observe_host(B, T, (end - t_pack) - seconds, adapter)
            if any(r.params.policy == "recguide" for r in reqs):
                cost.observe(B, self._priced_width(batch), seconds, adapter=adapter)

    def _priced_width(self, batch) -> float:
        """The tokens per row at which the cost refit learns a decode step.

        A padded backend pays for every row at the longest row's width. A packing one pays for real tokens:
        a step mixing 4-token draft rows with 1-token AR rows costs about a step of their mean
        width. Learned at the longest width instead, such cheap mixed steps pull the price of
        all-draft steps down, which makes drafting look cheaper and invites more mixing. At C = 4 on
        SmolLM2, RecGuide mixed L4 and AR rows and ran 0.92x AR, below both (docs/drafter.md, the sweep).
        """
        T = int(np.shape(batch.input_ids)[1])
        if not getattr(self.backend, "packs_rows", False) or batch.row_lens is None:
            return float(T)
        return float(np.sum(batch.row_lens)) / len(batch.row_lens)

    def _run_streams(self, batch, works: list[Work], reqs: list[Request]):
        """overlap="streams": verify rows and prospective rows as two concurrent forwards."""
        from .streams import (
            FusedRow,
            executor_for,
            merge_split_outputs,
            split_fused_batch,
            split_overlap_plan,
        )

        if self._stream_executor is None:
            self._stream_executor = executor_for(self.backend)
        fused = {b: FusedRow(verify_len=1 + len(r.draft.tokens), shared=w.prospective.shared,
                             block=w.prospective.block)
                 for b, (w, r) in enumerate(zip(works, reqs)) if w.kind is Kind.FUSED}
        split = split_fused_batch(batch, batch.row_lens, fused)  # the lengths the executor packed
        with trace_range("fused"):
            outs = self._stream_executor.run(split_overlap_plan(split.verify, split.prospective), self.backend)
        return merge_split_outputs(split, outs)

    def _apply(self, w: Work, r: Request, d: Decision, now: float) -> None:
        m = r.metrics
        m.forwards[w.kind.value] += 1
        if w.kind in (Kind.VERIFY, Kind.FUSED, Kind.AR):
            block = 1 if w.kind is Kind.AR else w.block
            m.rounds += 1
            m.block_sizes[block] += 1
            m.acceptance[(block, d.accepted)] += 1
            if block > 1:
                m.drafted_tokens += block - 1
                m.accepted_draft_tokens += d.accepted
            outcome = Round(block, d.accepted)
            if d.hit is not None:
                m.prospective += 1
                m.hits += int(d.hit)
            self.policies[r.params.policy].observe(r, outcome, d.hit, d.would_hit)
            r.history.append(outcome)
        if d.prompt_logprobs is not None:
            r.prompt_logprobs = d.prompt_logprobs
        r.cache_len += d.committed
        r.draft = d.draft
        if d.emitted:
            self._emit(r, d.emitted, now, prefill=w.kind is Kind.PREFILL, logprobs=d.logprobs)

    def _emit(self, r: Request, tokens: list[int], now: float, prefill: bool, logprobs=None) -> None:
        out = []
        eos = self.model_config.eos_token_ids
        stops = stop_ids(r.params, eos)
        for i, t in enumerate(tokens):
            if r.remaining <= 0:
                break
            out.append(t)
            if logprobs is not None:  # before output_ids: a reader of both never sees a token without its own
                r.output_logprobs.append(logprobs[i])
            r.output_ids.append(t)
            if t in stops:
                r.finish_reason = "eos" if t in eos and r.params.stop_at_eos else "stop"
                break
        if r.remaining <= 0 and r.finish_reason is None:
            r.finish_reason = "length"
        m = r.metrics
        m.output_tokens += len(out)
        if not prefill:
            m.decode_tokens += len(out)
        if m.first_token_time is None and out:
            m.first_token_time = now
        m.token_times.extend([now] * len(out))
        r.seed = tokens[-1] if r.finish_reason is None else r.seed
        if r.finish_reason is not None:
            r.status = Status.FINISHED
            m.finish_time = now
        if out and r.on_tokens is not None:
            try:
                r.on_tokens(r, out)
            except Exception as exc:  # a broken consumer must not stall the engine
                self._fail(r, f"token callback failed: {exc!r}")

    def _fail(self, r: Request, message: str) -> None:
        if r.done:
            return
        r.status = Status.FAILED
        r.error = message
        r.finish_reason = "error"
        r.metrics.finish_time = self.clock()
        if r.on_tokens is not None:
            try:
                r.on_tokens(r, [])
            except Exception:
                pass

    # -- admission, retirement ------------------------------------------------------------------
    def _drain_inbox(self) -> None:
        with self._lock:
            new, self._inbox = self._inbox, []
            cancels, self._cancels = self._cancels, set()
        self.waiting.extend(new)
        if cancels:
            for r in list(self.waiting) + self.running:
                if r.id in cancels and not r.done:
                    r.status = Status.CANCELLED
                    r.finish_reason = "cancelled"
                    r.metrics.finish_time = self.clock()
                    if r.on_tokens is not None:
                        r.on_tokens(r, [])
            self.waiting = deque(r for r in self.waiting if not r.done)
            self._retire()

    def _admit(self) -> None:
        while self.waiting and self._free_slots and len(self.running) < self.config.max_num_seqs:
            r = self.waiting[0]
            if self._reserved + r.reserved_tokens > self.kv_budget:
                if not self.running and r.reserved_tokens > self.kv_budget:
                    self.waiting.popleft()
                    self._fail(r, f"request needs {r.reserved_tokens} KV tokens, budget is {self.kv_budget}")
                    continue
                break
            self.waiting.popleft()
            r.slot = self._free_slots.pop(0) if self.prefix_cache is None else self._take_slot(r)
            r.status = Status.RUNNING
            self._reserved += r.reserved_tokens
            self.running.append(r)
        self.running.sort(key=lambda r: r.slot)

    def _take_slot(self, r: Request) -> int:
        """A free slot for ``r``, started from the longest cached prefix of its prompt: that K/V is copied into
        the slot (or already there) and ``r``'s committed length set, so that its prefill runs the rest only.

        A backend that keeps running requests in slots 0 … n-1 gets the lowest free slot. One that reads slots
        in place gets the slot :meth:`.PrefixCache.choose` picks, so that records live as long as the free slots
        allow."""
        cache, free = self.prefix_cache, self._free_slots
        prompt = self._prompts[r.id] = tokens_array(r.prompt_ids)
        # A running request is a source for its committed prompt tokens (a new prompt rarely continues a
        # running request's output; a finished one's record has it).
        running = ((q.slot, self._prompts[q.id][:q.cache_len]) for q in self.running
                   if q.cache_len and q.prompt_ids[0] == prompt[0])
        # Prompt log-probabilities need every prompt position's logits: such a request prefills its whole prompt.
        match = None if r.wants_prompt_logits else cache.lookup(prompt, running)
        slot = free[0] if self._compacts else cache.choose(free, match)
        if self._compacts and (held := cache.held(slot)) is not None and not starts_with(prompt, held):
            # r overwrites the record in its slot, wholly or past the head it reuses in place (another prompt's
            # tail, say an earlier chat's answer): a copy in a cache-only slot keeps it whole. A record r extends
            # is not copied: r's own record will cover it.
            self._evacuate(slot, keep=None if match is None else match.slot)
        free.remove(slot)
        if match is not None and match.slot != slot:
            try:
                self.backend.copy_slot(match.slot, slot, match.tokens)
            except Exception:  # a failed copy costs a full prefill, never the request
                cache.hits -= match.tokens
                match = None
        cache.drop(slot)  # the slot now holds r's tokens (a running source while r runs)
        if match is not None:
            r.cache_len = r.metrics.cached_prompt_tokens = match.tokens
        return slot

    def _retire(self) -> None:
        done = [r for r in self.running if r.done]
        if not done:
            return
        self.running = [r for r in self.running if not r.done]
        for r in done:
            self._reserved -= r.reserved_tokens
            self._free_slots.append(r.slot)
            if self.prefix_cache is not None:
                # A finished or cancelled request's committed K/V stays valid; a failed forward's may not.
                if r.status is Status.FAILED:
                    self.prefix_cache.drop(r.slot)
                else:
                    self.prefix_cache.hold(r.slot, self._committed(r))
                self._prompts.pop(r.id, None)
            forget = getattr(self.policies[r.params.policy], "forget", None)
            if forget is not None:
                forget(r.id)
        if self._compacts:
            self._compact()

    def _compact(self) -> None:
        """Keep running requests in slots 0 … n-1 so the backend reads the cache as one view."""
        self._free_slots.sort()
        n = len(self.running)
        movers = sorted((r for r in self.running if r.slot >= n), key=lambda r: r.slot)
        holes = [s for s in self._free_slots if s < n]
        for r, hole in zip(movers, holes):
            self._evacuate(hole)
            self.backend.copy_slot(r.slot, hole, r.cache_len)
            if self.prefix_cache is not None:  # the hole is overwritten (r itself is a source while it runs)
                self.prefix_cache.drop(hole)
            self._free_slots.remove(hole)
            self._free_slots.append(r.slot)
            r.slot = hole
        self._free_slots.sort()
        self.running.sort(key=lambda r: r.slot)

    def _evacuate(self, slot: int, keep: int | None = None) -> None:
        """Before a compacting backend's ``slot`` is overwritten: copy its cached prefix, if any, into the
        ``prefix_cache_slots`` beyond ``max_num_seqs`` (an empty one, else the one held longest ago), where
        admission never writes (it takes the lowest free slot). ``keep``: a slot not to write, the one the
        prefix for ``slot``'s next request is about to be copied from."""
        if self.prefix_cache is None:
            return
        held = self.prefix_cache.held(slot)
        extra = [s for s in self._free_slots if s >= self.config.max_num_seqs and s not in (slot, keep)]
        if held is None or not extra or self.prefix_cache.covered(slot):
            return
        target = self.prefix_cache.choose(extra, None)
        try:
            self.backend.copy_slot(slot, target, len(held))
        except Exception:  # the record is lost, nothing else
            self.prefix_cache.drop(target)
            return
        self.prefix_cache.hold(target, held)

    @staticmethod
    def _committed(r: Request) -> list[int]:
        """The tokens whose K/V ``r``'s slot holds at positions ``[0, cache_len)``. A verify round truncated by
        max_tokens or EOS commits more than it emits; only emitted tokens are known, so the slice stops there."""
        return (r.prompt_ids + r.output_ids)[:r.cache_len]

    def _ensure_cost_table(self) -> None:
        pol: RecGuidePolicy = self.policies["recguide"]
        if pol.cost is not None:
            return
        if not any(r.params.policy in self._costed for r in list(self.waiting) + self.running):
            return
        if self.running:
            return  # calibrate only on an idle backend; until then the policy uses token counts
        with trace_range("calibrate"):
            tokens = tuple(t for t in DEFAULT_TOKENS if t <= 2 * self.max_block)
            past = self.config.cost_past_len
            table = cached_cost_table(self.backend, dict(self._cost_key, max_slots=self.backend.max_slots,
                                                         tokens=tokens, past_len=past),
                                      tokens=tokens, past_len=past,
                                      draft_adapter=self._cost_key.get("draft_adapter", True),
                                      after_measure=self._forget_probed_kv)
            self.use_cost_table(table)

    def use_cost_table(self, table: CostTable) -> None:
        """Price steps with ``table``, a start-up measurement (this engine's, or another engine's on the same model,
        backend settings and machine), as if this engine had measured it."""
        self.policies["recguide"].cost = RefittedCostTable(table) if self.config.cost_refit else table
        # The peers get the start-up measurement itself, as their engines profile once at
        # start-up; only RecGuide refines it online (the refit is part of RecGuide).
        for name in self._costed - {"recguide"}:
            self.policies[name].cost = table

    def _forget_probed_kv(self, table: CostTable) -> None:
        """A measured table's probe forwards wrote every probed slot's K/V from its ``past_len`` on; what the
        prefix cache holds before that position is intact (a cached system prompt or chat turn stays)."""
        if self.prefix_cache is not None:
            self.prefix_cache.truncate(int(table.meta["past_len"]))

    # -- reporting -------------------------------------------------------------------------
    @property
    def time_forward(self) -> float:
        """Seconds spent in backend forwards (prefill and decode) since the engine started."""
        return self.phase_times["forward"]

    def occupancy(self) -> dict:
        """Requests waiting (submitted, not admitted) and running, and KV tokens reserved of the budget.

        Read from any thread (a snapshot; the step thread may change it the next moment)."""
        with self._lock:
            inbox = len(self._inbox)
        return {"waiting": inbox + len(self.waiting), "running": len(self.running),
                "kv_reserved_tokens": self._reserved, "kv_budget_tokens": self.kv_budget}

    def stats(self) -> dict:
        return {
            "steps": self.steps, "time_forward_s": self.time_forward, "time_step_s": self.time_step,
            "overhead_share": 1 - self.time_forward / self.time_step if self.time_step else None,
            "phase_times_s": dict(self.phase_times),
            "concurrency_hist": dict(self.concurrency_hist),
            "blocks_by_concurrency": {c: dict(v) for c, v in sorted(self.blocks_by_concurrency.items())},
            "prefix_cache": self.prefix_cache.stats() if self.prefix_cache is not None else None,
            "recguide": self.policies["recguide"].stats(),
            **{name: self.policies[name].stats() for name in PEER_CONTROLLERS},
        }
