"""The engine replicas' reports to the ingress: what ``/health``, ``/metrics`` and ``/v1/models`` need, pushed.

Why pushed: every call to an engine replica through Ray Serve (a handle call, ``broadcast`` too) takes one
of its ``max_ongoing_requests`` slots, which are its engine's ``max_num_seqs``. With every slot busy the
call waited for a running request to end, so ``/health`` and ``/metrics`` took as long as the rest of the
shortest running generation, and the scrape then showed the replica idle (``scripts/probe_endpoints.py``,
docs/replicas.md). A Prometheus scrape (10 s timeout) or a load balancer's health probe failed exactly when
the cluster was busiest.

Instead, each replica sends a :class:`Report` to one small actor, the board, every
:data:`REPORT_PERIOD_S`. A thread of the replica's own does this, outside Serve's request path, and the
ingress reads the latest reports. The board belongs to the ingress: it creates the board and the board
lives as long as the ingress does. A replica looks it up by name and looks again after a failure.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

REPORT_PERIOD_S = 0.5
"""How often a replica reports."""
STALE_S = 5.0
"""A replica whose last report is older than this counts as unreachable: it died, or its process stalls."""
FORGET_S = 60.0
"""A report older than this is dropped, so a replaced replica leaves the ``replicas_unreachable`` gauge."""


@dataclass(frozen=True)
class Report:
    """One replica's state at one moment: what the ingress's ``/health``, ``/metrics`` and ``/v1/models`` serve."""

    replica: str
    """Serve's replica id (the ``x-recguide-replica`` header and the ``replica`` label)."""
    alive: bool
    """Whether its engine loop runs (the single-process server's ``/health``)."""
    metrics: str
    """Its own ``/metrics`` text (:mod:`.openai_metrics`)."""
    models: dict
    """Its ``GET /v1/models`` body."""


def board_name(app_name: str) -> str:
    """The board's actor name: one board per Serve application."""
    return f"recguide-board:{app_name}"


class ReplicaBoard:
    """The latest report of each replica, aged on the board's own clock (the replicas' clocks may differ).

    Made a Ray actor by :func:`create_board`; plain Python, so it is tested without a cluster.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._reports: dict[str, tuple[float, Report]] = {}

    def put(self, report: Report) -> None:
        self._reports[report.replica] = (self._clock(), report)

    def read(self) -> tuple[list[Report], int]:
        """(the reports at most :data:`STALE_S` old, by replica; how many replicas' reports are older)."""
        now = self._clock()
        for replica, (at, _) in list(self._reports.items()):
            if now - at > FORGET_S:
                del self._reports[replica]
        fresh = sorted((r for at, r in self._reports.values() if now - at <= STALE_S), key=lambda r: r.replica)
        return fresh, len(self._reports) - len(fresh)


def create_board(app_name: str, namespace: str):
    """The application's board actor (the ingress's: it dies with the ingress), made or, if one runs, found."""
    import ray

    return ray.remote(ReplicaBoard).options(name=board_name(app_name), namespace=namespace, get_if_exists=True,
                                            num_cpus=0, max_restarts=0).remote()


class Reporter:
    """A replica's reporting thread: ``report()`` goes to the board every :data:`REPORT_PERIOD_S` seconds.

    A board that is not there yet (the ingress still starting) or is gone (the ingress restarted) is looked up
    again at the next period. A report still in flight skips the period, so a slow board never piles calls up.
    """

    def __init__(self, app_name: str, namespace: str, report: Callable[[], Report]):
        self._name, self._namespace, self._report = board_name(app_name), namespace, report
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="recguide-reporter", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import ray

        if not ray.is_initialized():   # not in a Ray worker: ray.get_actor would start a local Ray instance
            return
        board = pending = None
        while True:
            try:
                if board is None:
                    board = ray.get_actor(self._name, namespace=self._namespace)   # ValueError until it exists
                if pending is not None:
                    done, _ = ray.wait([pending], timeout=0)
                    if done:
                        ray.get(pending)   # raises if the board died: look it up again
                        pending = None
                if pending is None:
                    pending = board.put.remote(self._report())
            except Exception:  # noqa: BLE001 - no board (yet, or any more): try again next period
                board = pending = None
            if self._stop.wait(REPORT_PERIOD_S):
                return

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 2.0) -> None:
        """End the thread (it is between two reports within ``timeout``, unless a report is being rendered)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
