"""The sums a window cache collects per window (fisher_ref.engine.window_sums): weights
accumulated per (window, token), the reach of parents and states and the deferred
products, flushed after the cache was emptied, equal the same sums formed directly."""
import numpy as np

from cases import RTOL, rel
from fisher_ref import load_config
from tests.engine.test_window_cache import _cache, _windows


def test_accumulated_and_deferred_sums_survive_emptying_the_cache():
    """Weights accumulated, reach and deferred products over two uses, the cache
    emptied in between (budget of one window): the direct sums."""
    task = load_config("default")
    V, P = task.model.vocab_size, task.model.num_params
    rng = np.random.default_rng(3)
    W = _windows(task)
    want = {k: np.zeros(P) for k in ("Rh", "Rh2", "h2", "h4", "cross")}
    cache = _cache(task, budget=1, defer_bytes=0)
    ref = _cache(task)
    xi_of = ref.arrays  # filled below
    for half in (W[:3], W[3:]):
        ids = cache.ids(half)
        rows = cache.rows(ids)
        refrows = ref.rows(ref.ids(half))
        wts = rng.random((len(half), 2, V))
        K = np.arange(V)
        cache.accumulate(0, rows, K, wts)
        r = rng.random(len(half))
        cache.accumulate_reach(0, rows, r, 1)
        C, H = rng.normal(size=(len(half), 2, V)), rng.normal(size=(len(half), P))
        rd = rng.random(len(half))
        cache.defer(0, rows, C, H, ("Rh", "Rh2"), rd)
        x = xi_of["xip"][refrows]  # (b, V, P)
        mix = 2 * np.einsum("bp,bip->ip", H, np.einsum("biv,bvp->bip", C, x))  # (2, P)
        want["Rh"] += np.einsum("bv,bvp->p", wts[:, 0], x) + mix[0]
        want["Rh2"] += np.einsum("bv,bvp->p", wts[:, 1], x ** 2) + mix[1]
        want["cross"] += r @ xi_of["y0_2"][refrows]
        rH = rd[:, None] * H  # (b, P)
        want["h2"] += r @ xi_of["y0_2"][refrows] + 2 * (rH * xi_of["y0_1"][refrows]).sum(0)
        want["h4"] += r @ xi_of["y0_4"][refrows] + 4 * (rH * xi_of["y0_3"][refrows]).sum(0)
    cache.flush()
    for key in ("Rh", "Rh2", "h2", "h4"):
        assert rel(cache.sums[0][key], want[key]) <= RTOL, key
    assert rel(cache.sums[0]["cross"][1], want["cross"]) <= RTOL
