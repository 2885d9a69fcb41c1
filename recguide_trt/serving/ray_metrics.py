"""``GET /metrics`` of the Ray Serve app: each engine replica's own metrics, labelled with its replica.

Why here and not in Ray's metrics: every replica already renders the single-process server's
metrics (:mod:`.openai_metrics`: vLLM's names, RecGuide's gauges) from its own engine, so the
ingress asks all of them at scrape time (``DeploymentHandle.broadcast``) and adds a ``replica``
label to every sample; a dashboard built for ``recguide serve`` sums over the label and sees the
cluster, or splits by it and sees what each replica's RecGuide sees. The ingress adds what only it
knows: which replica answered each request it forwarded, and the requests that ended because
their replica died. Those counters outlive a replica (a restarted one starts its own at zero).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

REPLICA_LABEL = "replica"


def relabel(texts: Iterable[tuple[str, str]], label: str = REPLICA_LABEL) -> list[Metric]:
    """Parse each ``(replica, exposition text)`` and merge them, every sample tagged ``label=replica``.

    Samples of one family from several replicas end up in one family (the text format wants each
    family's samples together under one HELP / TYPE).
    """
    families: dict[str, Metric] = {}
    for replica, text in texts:
        for fam in text_string_to_metric_families(text):
            merged = families.get(fam.name)
            if merged is None:
                merged = families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            for s in fam.samples:
                merged.add_sample(s.name, {**s.labels, label: replica}, s.value, s.timestamp, s.exemplar)
    return list(families.values())


class _Fixed:
    """A collector that yields a fixed list of families (one scrape's replica metrics)."""

    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self):
        return iter(self.families)


class RoutingMetrics:
    """The ingress's own counters; :meth:`render` adds the replicas' metrics of one scrape."""

    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("recguide:replica_requests", "Requests the ingress forwarded, by the replica that "
                                "answered them.", [REPLICA_LABEL], registry=self.registry)
        self.failures = Counter("recguide:replica_failures", "Requests that ended with an error because their "
                                "replica died or could not be reached ('' when none was chosen yet).",
                                [REPLICA_LABEL], registry=self.registry)
        self.replicas = Gauge("recguide:replicas_reporting", "Engine replicas that answered this scrape.",
                              registry=self.registry)
        self.unreachable = Gauge("recguide:replicas_unreachable", "Engine replicas that failed to answer this scrape.",
                                 registry=self.registry)

    def render(self, replica_texts: list[tuple[str, str]], unreachable: int = 0) -> bytes:
        self.replicas.set(len(replica_texts))
        self.unreachable.set(unreachable)
        registry = CollectorRegistry()
        registry.register(_Fixed(relabel(replica_texts)))
        return generate_latest(self.registry) + generate_latest(registry)
