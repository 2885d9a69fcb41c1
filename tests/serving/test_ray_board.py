"""The replicas' board (:mod:`recguide_trt.serving.ray_board`) as plain Python, on a clock the test moves, and
the Ray ingress's answers from its reports (no cluster)."""

from __future__ import annotations

import json

import pytest

from recguide_trt.serving.ray_board import FORGET_S, STALE_S, ReplicaBoard, Report, Reporter


def test_fresh_reports_are_served_stale_ones_counted_old_ones_forgotten():
    now = [100.0]
    board = ReplicaBoard(clock=lambda: now[0])
    assert board.read() == ([], 0)
    board.put(Report("b", True, "m_b 1\n", {}))
    board.put(Report("a", False, "m_a 1\n", {}))
    assert [r.replica for r in board.read()[0]] == ["a", "b"] and board.read()[1] == 0
    board.put(Report("a", True, "m_a 2\n", {}))               # a newer report replaces the older
    assert board.read()[0][0] == Report("a", True, "m_a 2\n", {})
    now[0] += STALE_S / 2
    board.put(Report("b", True, "m_b 2\n", {}))
    now[0] += STALE_S / 2 + 0.1                            # a's report is now stale, b's is not
    fresh, stale = board.read()
    assert [r.replica for r in fresh] == ["b"] and stale == 1
    now[0] += FORGET_S                                     # both past FORGET_S: forgotten, not counted
    assert board.read() == ([], 0)
    board.put(Report("a", True, "", {}))                       # a replica that reports again is back
    assert board.read() == ([Report("a", True, "", {})], 0)


def test_a_reporter_outside_ray_ends_without_starting_ray():
    """Outside a Ray worker there is no board: the thread ends at once (ray.get_actor would start a local Ray
    instance)."""
    ray = pytest.importorskip("ray")

    calls = []
    reporter = Reporter("app", "ns", lambda: calls.append(1) or Report("r", True, "", {}))
    reporter.stop()
    assert not reporter.running and not calls and not ray.is_initialized()


def test_the_ingress_answers_health_and_models_from_the_reports():
    pytest.importorskip("ray")
    from starlette.requests import Request

    from recguide_trt.serving.ray_app import REPLICA_HEADER, RecGuideIngress

    ingress = object.__new__(RecGuideIngress)   # its answers only: no Serve context, no board
    ingress.api_key = "k"

    def get(auth: str | None = None) -> Request:
        headers = [(b"authorization", auth.encode())] if auth else []
        return Request({"type": "http", "method": "GET", "path": "/v1/models", "headers": headers})

    body = {"object": "list", "data": [{"id": "m", "object": "model"}]}
    up, down = Report("r1", True, "", body), Report("r2", False, "", body)
    ok = ingress._models(get("Bearer k"), [up, down])
    assert ok.status_code == 200 and json.loads(ok.body) == body and ok.headers[REPLICA_HEADER] == "r1"
    for bad in (None, "Bearer nope", "k"):
        r = ingress._models(get(bad), [up])
        assert r.status_code == 401 and json.loads(r.body)["error"]["code"] == "invalid_api_key"
    r = ingress._models(get("Bearer k"), [])
    assert r.status_code == 503 and json.loads(r.body)["error"]["code"] == "replica_unavailable"

    r = ingress._health([up, down], 0)
    assert r.status_code == 200 and json.loads(r.body) == {"status": "ok", "replicas": 1}
    for reports, stale, why in (([down], 1, "1 report a stopped engine loop, 1 stopped reporting"),
                                ([], 0, "none has reported yet")):
        r = ingress._health(reports, stale)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert json.loads(r.body)["error"]["message"] == f"no engine replica is serving: {why}"


def test_the_ingress_makes_a_dead_board_again_and_reads_the_new_one(monkeypatch):
    """A board that died (an earlier ingress's, after a redeploy): the ingress makes it again and reads the new
    one after the replicas' next reports, instead of answering with no replicas."""
    pytest.importorskip("ray")
    import asyncio

    from ray.exceptions import RayActorError

    from recguide_trt.serving import ray_app

    up = Report("r1", True, "", {})

    class Board:
        def __init__(self, answer):
            self.read = type("M", (), {"remote": staticmethod(lambda: answer())})()

    async def dead():
        raise RayActorError()

    async def fresh():
        return [up], 0

    made = []
    monkeypatch.setattr(ray_app, "create_board", lambda *at: made.append(at) or Board(fresh))
    monkeypatch.setattr(ray_app, "REPORT_PERIOD_S", 0.01)
    ingress = object.__new__(ray_app.RecGuideIngress)
    ingress._board_at, ingress.board = ("app", "ns"), Board(dead)
    assert asyncio.run(ingress._reports()) == ([up], 0) and made == [("app", "ns")]
    monkeypatch.setattr(ray_app, "create_board", lambda *at: made.append(at) or Board(dead))
    ingress.board = Board(dead)
    assert asyncio.run(ingress._reports()) == ([], 0) and len(made) == 3   # still dead: no reports, said so
