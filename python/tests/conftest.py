import threading
import time

import numpy as np
import pytest

import headsum


@pytest.fixture
def rng(request):
    # A seed per test, from its name: reproducible, different across tests.
    seed = sum(map(ord, request.node.name)) * 7919
    return np.random.default_rng(seed)


@pytest.fixture(autouse=True)
def default_settings():
    """Every test starts and ends on the best target and default threads."""
    headsum.set_target(None)
    headsum.set_num_threads(0)
    yield
    headsum.set_target(None)
    headsum.set_num_threads(0)


def torch_or_skip():
    try:
        import torch
    except ImportError:
        pytest.skip("torch is not installed (scripts/python_test.sh installs it with HEADSUM_PY_TORCH=1)")
    return torch


def copies():
    """Float32 stagings the binding has made so far: (count, bytes)."""
    return headsum._headsum._copy_stats()


def runnable_targets():
    """The compiled targets this CPU runs (set_target accepts them)."""
    ok = []
    for name in headsum.compiled_targets():
        try:
            headsum.set_target(name)
        except RuntimeError:
            continue
        ok.append(name)
    headsum.set_target(None)
    return ok


def assert_releases_gil(call):
    """Runs call() on a second thread while this one keeps time: with the GIL
    released this thread never stands still for half the call (a call that
    held it would stop it for all of it).  The call must take over 50 ms."""
    span = {}
    done = threading.Event()

    def worker():
        span["start"] = time.perf_counter()
        call()
        span["end"] = time.perf_counter()
        done.set()

    t = threading.Thread(target=worker)
    last = time.perf_counter()
    gap = 0.0
    t.start()
    while not done.is_set():
        now = time.perf_counter()
        gap = max(gap, now - last)
        last = now
    t.join()
    took = span["end"] - span["start"]
    assert took > 0.05, f"the call took only {took * 1e3:.1f} ms: too short to tell"
    assert gap < 0.5 * took, (
        f"the main thread stood still for {gap * 1e3:.1f} ms of a {took * 1e3:.1f} ms call"
    )
