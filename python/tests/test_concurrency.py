"""Calls from several threads overlap (the GIL is released) and stay correct; submit()
futures work with concurrent.futures and asyncio."""

import asyncio
import concurrent.futures
import sys
import threading
import time

import numpy as np

import rafter
from conftest import BERT


def inputs(k):
    rng = np.random.default_rng(k)
    ids = rng.integers(0, 100, (4, 16), dtype=np.int64)
    return ids, np.ones((4, 16), np.int64)


def test_four_threads_correct(bert):
    xs = [inputs(k) for k in range(8)]
    want = [bert(*x) for x in xs]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for _ in range(3):
            got = list(pool.map(lambda x: bert(*x), xs))
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)


def test_one_thread_per_call_is_correct(bert):
    """threads=1 (a core per call, for many Python threads): the same outputs."""
    one = rafter.compile(str(BERT / "model.onnx"), dims={"batch": 4, "seq": "<=16"},
                         threads=1)
    xs = [inputs(k) for k in range(4)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda x: one(*x), xs))
    for x, g in zip(xs, got):
        np.testing.assert_allclose(g, bert(*x), rtol=1e-5, atol=1e-5)


def test_gil_released_during_a_call(bert):
    """A Python thread runs while another thread is inside rafter. With a 1 s switch
    interval the spinner cannot take the GIL from a thread running Python for the fraction
    of a second these calls take, so its progress can only come from a call releasing it;
    up to 200 calls give it that chance however slowly the OS wakes it."""
    x = inputs(0)
    stop = threading.Event()
    ticks = [0]

    def spin():
        while not stop.is_set():
            ticks[0] += 1

    old = sys.getswitchinterval()
    t = threading.Thread(target=spin)
    t.start()
    try:
        while ticks[0] == 0:
            time.sleep(0.001)
        sys.setswitchinterval(1.0)
        # Hand the GIL over once more, so the spinner's next wait for it uses the 1 s interval.
        time.sleep(0.01)
        before = ticks[0]
        calls = 0
        while ticks[0] == before and calls < 200:
            bert(*x)
            calls += 1
        assert ticks[0] > before, f"the spinning thread never ran during {calls} calls"
    finally:
        sys.setswitchinterval(old)
        stop.set()
        t.join()


def test_submit_futures(bert):
    xs = [inputs(k) for k in range(4)]
    want = [bert(*x) for x in xs]
    futures = [bert.submit(*x) for x in xs]
    assert all(isinstance(f, concurrent.futures.Future) for f in futures)
    done = set(concurrent.futures.as_completed(futures, timeout=60))
    assert done == set(futures)
    for f, w in zip(futures, want):
        np.testing.assert_array_equal(f.result(), w)


def test_submit_is_awaitable(bert):
    xs = [inputs(k) for k in range(4)]
    want = [bert(*x) for x in xs]

    async def main():
        return await asyncio.gather(*(bert.submit(*x) for x in xs))

    for g, w in zip(asyncio.run(main()), want):
        np.testing.assert_array_equal(g, w)


def test_submit_refuses_bad_inputs_at_once(bert):
    import pytest
    import rafter

    ids, _ = inputs(0)
    with pytest.raises(rafter.InputError):
        bert.submit(ids)  # refused before anything runs
