"""Prometheus metrics of ``recguide serve`` (``GET /metrics``), with vLLM's names where one exists.

Counters and histograms are updated when a request ends (:meth:`ServerMetrics.observe`); the gauges
(waiting / running requests, KV budget in use, RecGuide's mode and hit rate) are read from the
engine at scrape time, so they are never stale. Each app has its own registry, so two apps in one
process (tests, a Ray Serve replica) do not share counters.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from ..runtime.metrics import RequestMetrics
from ..runtime.policies.recguide import ADAPTIVE, OVERLAP

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0,
                   40.0, 80.0)
TOKEN_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4,
                         0.5, 0.75, 1.0, 2.5)


class _EngineCollector:
    """Gauges read from the engine and the RecGuide policy when /metrics is scraped."""

    def __init__(self, engine, model_name: str):
        self.engine = engine
        self.model = model_name

    def collect(self):
        occ = self.engine.occupancy()
        labels = ["model_name"]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric([self.model], value)
            return g

        yield gauge("vllm:num_requests_running", "Requests decoding now.", occ["running"])
        yield gauge("vllm:num_requests_waiting", "Requests submitted and not yet admitted.", occ["waiting"])
        budget = occ["kv_budget_tokens"]
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache budget reserved by admitted requests (1 = full).",
                    occ["kv_reserved_tokens"] / budget if budget else 0.0)
        yield gauge("recguide:kv_reserved_tokens", "KV-cache tokens reserved by admitted requests.",
                    occ["kv_reserved_tokens"])
        stats = self.engine.policies["recguide"].stats()
        yield gauge("recguide:prospective_hit_rate", "RecGuide's estimate of how often a prospective row hits.",
                    float(stats["hit_rate"]))
        mode = GaugeMetricFamily("recguide:mode", "RecGuide's current mode (1 for the active one).",
                                 labels=["model_name", "mode"])
        for name in (OVERLAP, ADAPTIVE):
            mode.add_metric([self.model, name], float(stats["mode"] == name))
        yield mode
        steps = GaugeMetricFamily("recguide:mode_steps", "Decode steps RecGuide ran in each mode.",
                                  labels=["model_name", "mode"])
        for name, n in sorted(stats["mode_steps"].items()):
            steps.add_metric([self.model, str(name)], float(n))
        yield steps


class ServerMetrics:
    """The server's metrics registry; ``observe`` one finished request, ``render`` for a scrape."""

    def __init__(self, engine, model_name: str):
        self.registry = CollectorRegistry()
        self.model = model_name
        r = self.registry
        lab = ["model_name"]
        self.success = Counter("vllm:request_success", "Finished requests by finish reason.",
                               ["model_name", "finished_reason"], registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens of finished requests.", lab, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated.", lab, registry=r)
        self.cache_queries = Counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", lab,
                                     registry=r)
        self.cache_hits = Counter("vllm:prefix_cache_hits", "Prompt tokens the prefix cache served (not prefilled).",
                                  lab, registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Submission to first token.", lab,
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("vllm:time_per_output_token_seconds", "Per request: (e2e - TTFT) / (tokens - 1).",
                              lab, buckets=TOKEN_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Between successive token emissions.", lab,
                             buckets=TOKEN_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Submission to the end of the request.", lab,
                             buckets=LATENCY_BUCKETS, registry=r)
        self.drafts = Counter("vllm:spec_decode_num_drafts", "Verify rounds with a draft block.", lab, registry=r)
        self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Draft tokens verified.", lab, registry=r)
        self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.", lab, registry=r)
        self.accepted_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                    "Draft tokens accepted at each draft position (0 = first draft token).",
                                    ["model_name", "position"], registry=r)
        self.prospective = Counter("recguide:prospective_rows", "Fused steps that drafted a prospective block.",
                                   lab, registry=r)
        self.hits = Counter("recguide:prospective_hits", "Prospective blocks used as the next draft.", lab,
                            registry=r)
        self.by_policy = Counter("recguide:requests", "Finished requests by policy.", ["model_name", "policy"],
                                 registry=r)
        r.register(_EngineCollector(engine, model_name))

    def observe(self, m: RequestMetrics, finish_reason: str, policy: str) -> None:
        """One finished request (``finish_reason``: stop / length / abort / error)."""
        model = self.model
        self.success.labels(model, finish_reason).inc()
        self.by_policy.labels(model, policy).inc()
        self.prompt_tokens.labels(model).inc(m.prompt_tokens)
        self.cache_queries.labels(model).inc(m.prompt_tokens)
        self.cache_hits.labels(model).inc(m.cached_prompt_tokens)
        self.generation_tokens.labels(model).inc(m.output_tokens)
        if m.ttft is not None:
            self.ttft.labels(model).observe(m.ttft)
        if m.tpot is not None:
            self.tpot.labels(model).observe(m.tpot)
        for x in m.itl():
            self.itl.labels(model).observe(x)
        if m.e2e is not None:
            self.e2e.labels(model).observe(m.e2e)
        for (block, accepted), n in m.acceptance.items():
            if block < 2:
                continue
            self.drafts.labels(model).inc(n)
            self.draft_tokens.labels(model).inc(n * (block - 1))
            self.accepted.labels(model).inc(n * accepted)
            for pos in range(accepted):
                self.accepted_pos.labels(model, str(pos)).inc(n)
        self.prospective.labels(model).inc(m.prospective)
        self.hits.labels(model).inc(m.hits)

    def render(self) -> bytes:
        return generate_latest(self.registry)
