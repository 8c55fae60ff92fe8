"""What an HTTP client sees through HAProxy when a replica dies with requests in flight (issue #45).

Two ``isan-serve`` replicas behind HAProxy run with the committed docs/guide/deploy/haproxy.cfg
(:class:`test_serve_lb.Cluster`, the guide's commands on loopback). Keep-alive clients each have a
seeded ``/v1/sample`` in flight on both replicas when one is killed (SIGKILL): every request is
answered, 200 with the library's text (the balancer sent it again to the other replica) or 502 in
the server's error shape, never a connection closed without an answer; a 502 sent again gets the
text.
"""

from __future__ import annotations

import threading
import time

import pytest

httpx = pytest.importorskip("httpx")

from test_serve_lb import cluster, metric  # noqa: E402,F401 (cluster: the fixture, shared)

#: concurrent requests (half on each replica), characters each generates
CLIENTS, CHARS = 16, 10_000


def test_requests_in_flight_on_a_killed_replica_get_an_answer(cluster, default_engine):
    def body(i: int) -> dict:
        return {"prompt": "the ", "n": CHARS, "seed": i, "stream": False}

    clients = [httpx.Client(base_url=cluster.url, timeout=120) for _ in range(CLIENTS)]
    try:
        for c in clients:  # each client has made a request: it sends the next on a kept-alive connection
            assert c.post("/v1/score", json={"text": "the cat"}).status_code == 200
        results: list = [None] * CLIENTS

        def send(i: int) -> None:
            try:
                results[i] = clients[i].post("/v1/sample", json=body(i))
            except httpx.TransportError as e:  # a connection closed without an answer
                results[i] = e

        threads = [threading.Thread(target=send, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        time.sleep(0.5)  # each replica is generating its half (about 0.3 s of work each, one after another)
        cluster.replicas[0].kill()
        cluster.replicas[0].wait(30)
        for t in threads:
            t.join(120)
        bare = [(i, repr(r)) for i, r in enumerate(results) if not isinstance(r, httpx.Response)]
        assert not bare, f"requests left without an answer: {bare}"
        failed = [i for i, r in enumerate(results) if r.status_code != 200]
        for i in failed:
            r = results[i]
            assert r.status_code == 502 and r.json()["status"] == 502 and "send the request again" in r.json()["error"]
            results[i] = httpx.post(f"{cluster.url}/v1/sample", json=body(i), timeout=120)
        for i, r in enumerate(results):
            assert r.status_code == 200, r.text
            assert r.json()["text"] == default_engine.sample("the ", n=CHARS, seed=i).text
        # the killed replica answered none of its half: the survivor did (retried by HAProxy, or sent again)
        metrics = httpx.get(f"{cluster.replica_url(1)}/metrics", timeout=30).text
        assert metric(metrics, 'isan_requests_total{endpoint="sample",status="200"}') > CLIENTS // 2
    finally:
        for c in clients:
            c.close()
