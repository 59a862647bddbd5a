"""Targets, threads, the GIL, and that the reference bounds can fail."""

import numpy as np
import pytest

import headsum
from conftest import assert_releases_gil, runnable_targets
from reference import assert_within, attention_ref, f64, project_ref


def test_targets():
    names = headsum.compiled_targets()
    assert names and all(isinstance(n, str) and n for n in names)
    runnable = runnable_targets()
    assert runnable, "no compiled target runs on this CPU"
    # The default is the best runnable target: the first of them.
    assert headsum.active_target() == runnable[0]
    for name in runnable:
        headsum.set_target(name)
        assert headsum.active_target() == name
    headsum.set_target(None)
    assert headsum.active_target() == runnable[0]


def test_unknown_target_is_runtime_error_and_changes_nothing():
    headsum.set_target(runnable_targets()[-1])
    active = headsum.active_target()
    with pytest.raises(RuntimeError, match="NOT_A_TARGET"):
        headsum.set_target("NOT_A_TARGET")
    assert headsum.active_target() == active


def test_every_target_matches_reference(rng):
    q, k, v = (rng.standard_normal((1, 2, 9, 24)).astype(np.float32) for _ in range(3))
    o, wo = q, (rng.standard_normal((48, 20)) / 7).astype(np.float32)
    a_ref, a_bound = attention_ref(f64(q), f64(k), f64(v), True, 1 / np.sqrt(24))
    y_ref, y_bound = project_ref(f64(o), f64(wo))
    for name in runnable_targets():
        headsum.set_target(name)
        assert_within(headsum.attention(q, k, v, causal=True), a_ref, a_bound, f"attention on {name}")
        assert_within(headsum.project_heads_sum(o, wo), y_ref, y_bound, f"projection on {name}")


def test_threads(rng):
    q, k, v = (rng.standard_normal((2, 4, 64, 32)).astype(np.float32) for _ in range(3))
    with pytest.raises(ValueError, match="-1"):
        headsum.set_num_threads(-1)
    results = []
    for n in (1, 2, 3, 0):
        headsum.set_num_threads(n)
        results.append(headsum.attention(q, k, v, causal=True))
    # The library's promise: bitwise the same for any thread count.
    for r in results[1:]:
        assert np.array_equal(r, results[0])


def test_bounds_can_fail(rng):
    """The reference bounds catch small mistakes: a scale off by 0.1%, one
    head's term off by 0.01%."""
    q, k, v = (rng.standard_normal((1, 2, 16, 32)).astype(np.float32) for _ in range(3))
    ref, bound = attention_ref(f64(q), f64(k), f64(v), False, 1 / np.sqrt(32))
    wrong = headsum.attention(q, k, v, scale=1.001 / np.sqrt(32))
    with pytest.raises(AssertionError, match="out of bound"):
        assert_within(wrong, ref, bound, "wrong scale")
    o = rng.standard_normal((1, 4, 8, 16)).astype(np.float32)
    wo = rng.standard_normal((64, 32)).astype(np.float32)
    ref, bound = project_ref(f64(o), f64(wo))
    gates = np.array([1, 1, 1.0001, 1], np.float32)
    with pytest.raises(AssertionError, match="out of bound"):
        assert_within(headsum.project_heads_sum(o, wo, gates=gates), ref, bound, "wrong gate")
    # And a correct result passes.
    assert_within(headsum.project_heads_sum(o, wo), ref, bound, "right")


# --- the GIL ---------------------------------------------------------------


@pytest.mark.parametrize("with_options", [False, True])
def test_gil_released_during_kernel(with_options):
    """While one thread is inside a long attention call, the main thread runs
    Python code.  It records the longest gap between two of its loop steps:
    with the GIL held for the call, that gap is the whole call (the main
    thread waits for the GIL); released, it is a scheduling slice.  This
    holds on one core too, with the options as without."""
    headsum.set_num_threads(1)
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((1, 8, 4096, 64)).astype(np.float32) for _ in range(3))
    options = {}
    if with_options:
        mask = np.zeros((1, 1, 1, 4096), np.float32)
        mask[..., :100] = -np.inf
        options = {"bias": mask, "sinks": np.zeros(8, np.float16), "softcap": 30.0}
    assert_releases_gil(lambda: headsum.attention(q, k, v, **options))
