"""The server's parts: the batching scheduler, the memory budget, state snapshots; and the limits
end to end (busy, timeouts, cancellation on disconnect, stream limits, a diverging text in a batch)."""

import asyncio
import json
import socket
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
from websockets.sync.client import connect  # noqa: E402

from isan.engine import Engine  # noqa: E402
from isan.engine.serve import ServeConfig, create_app  # noqa: E402
from isan.engine.serve.budget import Budget, Reservation, job_bytes, prepare_bytes  # noqa: E402
from isan.engine.serve.scheduler import Job, Scheduler, plan_round  # noqa: E402
from isan.engine.serve.snapshot import SnapshotError, decode_state, encode_state, token_chars  # noqa: E402
from isan.errors import StateDivergedError  # noqa: E402
from server_helpers import SlowEngine, running  # noqa: E402
from tolerances import engine_float32_tolerance  # noqa: E402


# ---- plan_round ---------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 50_000), min_size=1, max_size=60), st.integers(1, 200_000), st.integers(1, 4096))
def test_plan_round_is_fair_and_within_budget(remaining, budget, min_slice):
    min_slice = min(min_slice, budget)
    sizes = plan_round(remaining, budget, min_slice)
    assert len(sizes) == len(remaining)
    assert all(0 <= s <= r for s, r in zip(sizes, remaining))
    assert sum(sizes) <= budget
    assert sum(sizes) > 0  # every round makes progress
    if sum(remaining) <= budget:
        assert sizes == remaining
        return
    cut = [s for s, r in zip(sizes, remaining) if 0 < s < r]
    finished = [s for s, r in zip(sizes, remaining) if s == r]
    if cut and min(cut) < min_slice:
        raise AssertionError(f"a slice below min_slice: {sizes}")
    if all(s > 0 for s in sizes) and cut:
        # max-min fair: the jobs that did not finish got equal slices, no smaller than any finished job
        assert len(set(cut)) == 1 and cut[0] >= max(finished, default=0)
    else:
        # too many jobs: the first ones get min_slice each (or what they have left) while it fits
        assert all(s == min(r, min_slice) for s, r in zip(sizes, remaining) if s > 0)


def test_plan_round_examples():
    assert plan_round([100, 5000, 90000], 10000, 1024) == [100, 4950, 4950]
    assert plan_round([10, 20], 1000, 64) == [10, 20]
    # too many jobs for min_slice each: the first ones (least recently served) go first
    assert plan_round([5000] * 10, 4096, 1024) == [1024, 1024, 1024, 1024, 0, 0, 0, 0, 0, 0]


# ---- the scheduler on its own ---------------------------------------------------------------------
def _run_jobs(sched, jobs, cancel_after=None):
    async def main():
        futs = [sched.submit(j) for j in jobs]
        if cancel_after is not None:
            await asyncio.sleep(cancel_after[1])
            sched.cancel(cancel_after[0])
        return await asyncio.gather(*futs)

    return asyncio.run(main())


def test_scheduler_batches_and_slices_exactly(small_bundle, text8_valid_head):
    """Jobs of many lengths, cut into slices over rounds and scored together, give each text's bits
    (within float32 rounding) and its final state."""
    eng = Engine.load(small_bundle)
    rounds = []
    sched = Scheduler(eng, round_chars=3000, min_slice_chars=256, threads=1, on_round=rounds.append)
    lengths = [1, 7, 300, 2500, 9000, 20_000]
    texts = [text8_valid_head[i * 20 : i * 20 + n] for i, n in enumerate(lengths)]
    jobs = [Job(eng.prepare(t).ids, eng.initial_state(), per_char=True) for t in texts]
    done = _run_jobs(sched, jobs)
    sched.stop()
    for t, job in zip(texts, done):
        lib = eng.score(t, per_char=True)
        tol = engine_float32_tolerance(eng, t).twice()  # batched vs the library's path: two float32 computations
        assert job.error is None and job.pos == len(t)
        assert abs(job.total - lib.bits) <= tol.total_bits
        np.testing.assert_allclose(job.bits, lib.per_char_bits, rtol=0, atol=tol.bits)
        np.testing.assert_allclose(job.state.h, lib.state.h, rtol=0, atol=tol.state)
        assert job.state.chars == len(t) and job.state.last_symbol == t[-1]
    assert max(r.chars for r in rounds) <= 3000
    assert max(r.jobs for r in rounds) >= 4  # scored together
    assert done[-1].rounds > 5  # the long text took several rounds


def test_scheduler_without_batching_uses_the_engines_path(default_engine, text8_valid_head):
    sched = Scheduler(default_engine, round_chars=4096, min_slice_chars=1024, batching=False, threads=1)
    text = text8_valid_head[:5000]
    (job,) = _run_jobs(sched, [Job(default_engine.prepare(text).ids, default_engine.initial_state())])
    sched.stop()
    assert job.scoring["path"] == "composed" and job.rounds == 2
    tol = engine_float32_tolerance(default_engine, text).twice()  # cut in two rounds vs one plan: two float32
    assert abs(job.total - default_engine.score(text).bits) <= tol.total_bits


def test_a_diverging_job_fails_alone(unconstrained_engine, text8_valid_head):
    """'z' repeated drives the unconstrained model's state out of range: that job gets a
    StateDivergedError naming the offset in its own input, the others of the batch are scored."""
    eng = unconstrained_engine
    sched = Scheduler(eng, round_chars=100_000, threads=1)
    good = [text8_valid_head[i * 500 : (i + 1) * 500] for i in range(5)]
    bad = "the zebra " + "z" * 200
    prep = eng.prepare("The Zebra. " + "Z" * 200)  # normalised: the offsets differ from the scored ones
    jobs = [Job(eng.prepare(t).ids, eng.initial_state()) for t in good[:3]]
    jobs.append(Job(prep.ids, eng.initial_state(), offsets=prep.offsets.astype(np.int32), normalizer="text8-v1"))
    jobs += [Job(eng.prepare(t).ids, eng.initial_state()) for t in good[3:]]
    done = _run_jobs(sched, jobs)
    sched.stop()
    err = done[3].error
    with pytest.raises(StateDivergedError):
        eng.score(bad)
    lib_err = None
    try:
        eng.score("The Zebra. " + "Z" * 200)
    except StateDivergedError as e:
        lib_err = e
    assert isinstance(err, StateDivergedError) and err.input_offset == lib_err.input_offset
    assert f"input offset {lib_err.input_offset}" in str(err) and "text 0 of the batch" not in str(err)
    for t, job in zip(good, done[:3] + done[4:]):
        tol = engine_float32_tolerance(eng, t).twice()  # batched vs the library: two float32 computations
        assert job.error is None and abs(job.total - eng.score(t).bits) <= tol.total_bits


def test_cancelled_jobs_stop_being_scored(small_bundle, text8_valid_head):
    eng = SlowEngine(Engine.load(small_bundle), delay_s=0.02)
    sched = Scheduler(eng, round_chars=1000, min_slice_chars=500, threads=1)
    long_job = Job(eng.prepare(text8_valid_head[:20_000]).ids, eng.initial_state())
    short = Job(eng.prepare(text8_valid_head[:100]).ids, eng.initial_state())
    done = _run_jobs(sched, [long_job, short], cancel_after=(long_job, 0.2))
    time.sleep(0.1)
    assert sched.pending == 0 and sched.cancelled_jobs == 1
    sched.stop()
    assert done[1].pos == 100 and 0 < long_job.pos < 20_000


# ---- budget and snapshots ---------------------------------------------------------------------
def test_budget_and_reservations():
    b = Budget(1000)
    r1, r2 = Reservation(b), Reservation(b)
    assert r1.grow(600) and not r2.grow(500) and r2.bytes == 0 and b.used == 600
    assert r1.resize(100) and r2.resize(800) and b.used == 900 and not r1.resize(300) and r1.bytes == 100
    r1.release(), r1.release(), r2.release()
    assert b.used == 0 and b.peak == 900
    assert job_bytes(1000, True) > job_bytes(1000, False) > 1000


def test_snapshot_round_trip_and_refusals(small_params):
    from isan.engine import State

    h = np.random.default_rng(0).normal(size=16)
    s = State(h, 12, 34.5, "q")
    sha, key = "cd" * 32, b"s" * 32
    tok = encode_state(s, sha, key)
    assert len(tok) <= token_chars(16)
    back = decode_state(tok, sha, key, 16, 1e4)
    assert np.array_equal(back.h, s.h) and (back.chars, back.bits, back.last_symbol) == (12, 34.5, "q")
    with pytest.raises(SnapshotError) as e:
        decode_state(tok, sha, b"t" * 32, 16)
    assert e.value.status == 403
    with pytest.raises(SnapshotError) as e:
        decode_state(encode_state(s, "ef" * 32, key), sha, key, 16)
    assert e.value.status == 409
    with pytest.raises(SnapshotError) as e:
        decode_state(tok, sha, key, 17)
    assert e.value.status == 409
    with pytest.raises(SnapshotError) as e:
        decode_state(encode_state(State(h * 1e6), sha, key), sha, key, 16, 1e4)
    assert e.value.status == 422
    for junk in ("", "!!!", "QUJD", "x" + tok):
        with pytest.raises(SnapshotError) as e:
            decode_state(junk, sha, key, 16)
        assert e.value.status == 400
    for cut in (tok[:40], tok[:-1], tok + "A", tok[:200]):  # a snapshot cut or lengthened: changed
        with pytest.raises(SnapshotError) as e:
            decode_state(cut, sha, key, 16)
        assert e.value.status == 403


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_any_changed_snapshot_is_refused(data):
    from isan.engine import State
    import base64

    sha, key = "cd" * 32, b"s" * 32
    tok = encode_state(State(np.arange(16.0), 3, 1.5, "a"), sha, key)
    raw = bytearray(base64.urlsafe_b64decode(tok + "=" * (-len(tok) % 4)))
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    bad = base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()
    with pytest.raises(SnapshotError) as e:
        decode_state(bad, sha, key, 16)
    assert e.value.status in (400, 403)


# ---- limits end to end --------------------------------------------------------------------------
def test_busy_server_answers_503_and_recovers(small_bundle, text8_valid_head):
    """With the memory budget taken by a request in flight, the next one is refused with 503 and
    Retry-After; once the first is answered there is room again. A text that can never fit is 413."""
    eng = SlowEngine(Engine.load(small_bundle))
    text = text8_valid_head[:20_000]
    room = (prepare_bytes(20_000) + 70_000) / 2**20  # one such request (and its body) at a time
    app = create_app(eng, config=ServeConfig(max_chars=200_000, max_pending_mb=room))
    with running(app) as addr:
        eng.gate.clear()

        async def main():
            async with httpx.AsyncClient(timeout=60) as c:
                first = asyncio.ensure_future(c.post(f"http://{addr}/v1/score", json={"text": text}))
                await asyncio.sleep(0.5)
                second = await c.post(f"http://{addr}/v1/score", json={"text": text})
                eng.gate.set()
                first = await first
                await asyncio.sleep(0.3)  # the reservation is released once the answer has been sent
                return first, second, await c.post(f"http://{addr}/v1/score", json={"text": text})

        first, second, third = asyncio.run(main())
        assert first.status_code == 200 and third.status_code == 200
        assert second.status_code == 503 and second.headers["retry-after"] == "1"
        assert "busy" in second.json()["error"] and second.json()["status"] == 503
        r = httpx.post(f"http://{addr}/v1/score", json={"text": text * 5})
        assert r.status_code == 413 and "--max-pending-mb" in r.json()["error"]
        assert app.state.service.budget.used == 0


def test_request_timeout_is_503_and_drops_the_work(small_bundle, text8_valid_head):
    eng = SlowEngine(Engine.load(small_bundle), delay_s=0.3)
    app = create_app(eng, config=ServeConfig(request_timeout_s=0.5, round_chars=1000, min_slice_chars=1000))
    with running(app) as addr:
        r = httpx.post(f"http://{addr}/v1/score", json={"text": text8_valid_head[:10_000]}, timeout=30)
        assert r.status_code == 503 and "within 0.5 s" in r.json()["error"]
        time.sleep(0.8)
        sched = app.state.service.scheduler
        assert sched.pending == 0 and sched.chars_scored < 10_000
        assert 'isan_cancelled_total{reason="timeout"} 1.0' in httpx.get(f"http://{addr}/metrics").text


def test_client_that_leaves_has_its_work_dropped(small_bundle, text8_valid_head):
    """A client disconnects in the middle of a long request: the scheduler stops scoring it."""
    eng = SlowEngine(Engine.load(small_bundle), delay_s=0.05)
    app = create_app(eng, config=ServeConfig(round_chars=2000, min_slice_chars=1000))
    with running(app) as addr:
        host, port = addr.split(":")
        body = json.dumps({"text": text8_valid_head[:20_000]}).encode()
        with socket.create_connection((host, int(port))) as s:
            s.sendall(b"POST /v1/score HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            time.sleep(0.4)
        deadline = time.time() + 10
        sched = app.state.service.scheduler
        while sched.cancelled_jobs == 0 and time.time() < deadline:
            time.sleep(0.05)
        scored = sched.chars_scored
        time.sleep(0.3)
        assert sched.cancelled_jobs == 1 and sched.pending == 0
        assert 0 < scored < 20_000 and sched.chars_scored == scored  # nothing more was scored
        assert 'isan_cancelled_total{reason="disconnect"} 1.0' in httpx.get(f"http://{addr}/metrics").text
        assert app.state.service.budget.used == 0


def test_stream_limits(small_bundle):
    """Beyond --max-streams a stream gets a 503 frame and close code 1013; an idle stream is closed."""
    from websockets.exceptions import ConnectionClosed

    eng = Engine.load(small_bundle)
    # the idle timeout must outlast opening two streams on a loaded machine (0.5 s did not, once)
    app = create_app(eng, config=ServeConfig(max_streams=2, stream_idle_timeout_s=2.0))
    with running(app) as addr:
        with connect(f"ws://{addr}/v1/stream") as a, connect(f"ws://{addr}/v1/stream") as b:
            a.send(json.dumps({"text": "abc"}))
            assert json.loads(a.recv(timeout=10))["chars"] == 3
            with connect(f"ws://{addr}/v1/stream") as c:
                msg = json.loads(c.recv(timeout=10))
                assert msg["status"] == 503 and "--max-streams" in msg["error"]
                with pytest.raises(ConnectionClosed) as closed:
                    c.recv(timeout=10)
                assert closed.value.rcvd.code == 1013
            time.sleep(2.5)
            msg = json.loads(b.recv(timeout=10))
            assert msg["status"] == 408 and "idle" in msg["error"] or "no frame" in msg["error"]
        deadline = time.time() + 5
        while app.state.service.streams_open and time.time() < deadline:
            time.sleep(0.05)
        assert app.state.service.streams_open == 0


def test_concurrent_requests_are_batched_and_exact(default_engine, text8_valid_head):
    """60 clients at once on real text: every answer equals offline scoring within float32
    rounding, and the scheduler scored them in far fewer rounds than requests."""
    eng = default_engine
    texts = [text8_valid_head[i * 300 : i * 300 + 300 + 7 * i] for i in range(60)]
    app = create_app(eng)
    with running(app) as addr:
        async def main():
            async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=100)) as c:
                return await asyncio.gather(*(c.post(f"http://{addr}/v1/score", json={"text": t}) for t in texts))

        answers = asyncio.run(main())
        rounds = app.state.service.scheduler.rounds
    for t, r in zip(texts, answers):
        # short texts (300-713 characters), batched vs the composed path: two float32 computations
        tol = engine_float32_tolerance(eng, t).twice()
        assert r.status_code == 200 and abs(r.json()["bits"] - eng.score(t).bits) <= tol.total_bits
    assert rounds < 30


def test_many_streams_at_once_are_exact(default_engine, text8_valid_head):
    """200 WebSocket streams sending chunks at once: every running total equals scoring the
    stream's whole text offline, and rounds scored many streams together."""
    from websockets.asyncio.client import connect as aconnect

    eng = default_engine
    texts = [text8_valid_head[i * 90 : i * 90 + 300] for i in range(200)]
    app = create_app(eng)
    with running(app) as addr:
        async def stream(t):
            async with aconnect(f"ws://{addr}/v1/stream", open_timeout=60) as ws:
                for a in range(0, 300, 100):
                    await ws.send(json.dumps({"text": t[a : a + 100]}))
                    msg = json.loads(await ws.recv())
                return msg

        async def main():
            return await asyncio.gather(*(stream(t) for t in texts))

        answers = asyncio.run(main())
        sched = app.state.service.scheduler
        rounds, scored = sched.rounds, sched.chars_scored
    for t, msg in zip(texts, answers):
        # three 100-character chunks through the batched kernel vs one composed pass: two float32 computations
        tol = engine_float32_tolerance(eng, t).twice()
        assert msg["total_chars"] == 300 and abs(msg["total_bits"] - eng.score(t).bits) <= tol.total_bits
    assert scored == 200 * 300 and rounds < 200


def test_slow_body_is_408_and_frees_its_budget(small_bundle):
    eng = Engine.load(small_bundle)
    app = create_app(eng, config=ServeConfig(read_timeout_s=0.5))
    with running(app) as addr:
        host, port = addr.split(":")
        with socket.create_connection((host, int(port))) as s:
            s.sendall(b"POST /v1/score HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 1000\r\n\r\n{\"text\": \"ab")
            s.settimeout(10)
            answer = s.recv(4096).decode()
        assert answer.startswith("HTTP/1.1 408") and '"status":408' in answer
        assert app.state.service.budget.used == 0


def test_kernel_rounds_equal_score_batch(default_engine, text8_valid_head):
    """The scheduler's direct kernel call computes what Engine.score_batch computes (the same kernel
    call on the same ids, states and threads): the same bits and final states, exactly."""
    from isan.engine.serve.scheduler import KernelRounds

    eng = default_engine
    texts = [eng.prepare(text8_valid_head[i * 700 : i * 700 + 50 + 300 * i]).ids for i in range(9)]
    states = [eng.initial_state(), *(eng.score(text8_valid_head[:40 * i]).state for i in range(1, 9))]
    bits, finals = KernelRounds(eng).score([t.astype(np.int32) for t in texts], np.stack([s.h for s in states]), 2)
    lib = eng.score_batch(texts, states, per_char=True, normalize="none", threads=2)
    for b, hf, r in zip(bits, finals, lib):
        assert np.array_equal(b, r.per_char_bits) and np.array_equal(hf, r.state.h)
