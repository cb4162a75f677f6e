"""WindowCache: run-wide window ids, per-window arrays against the plain per-state
ones, per-(window, token) sums and deferred products against direct sums, and
results unchanged when the cache is emptied between uses."""
import numpy as np
import pytest

from cases import RTOL, rel, with_options
from fisher_ref import load_config
from fisher_ref.models.base import windows_for
from fisher_ref.numerics import token_fisher, uniform_token_fisher
from fisher_ref.engine.run import checked_sensitivities, model_probs, stream_specs
from fisher_ref.engine.window_cache import WindowCache

NAMES = {0: [("Rh", 1), ("Rh2", 2)]}


def _cache(task, budget=2 ** 26, **kw):
    return WindowCache(task, stream_specs(task, ()), True, budget, NAMES, **kw)


def _windows(task):
    states = [(), (1,), (1, 2), (3, 1), (2, 2, 4), (1,)]
    return windows_for(states, task.model.context, task.model.bos)


@pytest.mark.parametrize("dense", [True, False])
def test_ids_are_run_wide_and_give_back_the_windows(dense):
    """Keys looked up in a table indexed by key, or (many possible keys) in a dict: ids
    in order of first appearance either way."""
    task = load_config("default")
    cache, W = _cache(task, **({} if dense else {"dense_keys": 0})), _windows(task)
    assert (cache.id_of_key is not None) == dense
    ids = cache.ids(W)
    assert ids.tolist() == [0, 1, 2, 3, 4, 1]
    assert np.array_equal(cache.windows_of(ids), W)
    assert np.array_equal(cache.ids(W[::-1]), ids[::-1])  # same ids on a second call


def test_ids_of_many_and_of_very_long_windows():
    """Ids past the first table size, and windows too long for integer keys (tuples)."""
    from fisher_ref import FunctionModel, Task
    task = load_config("default")
    cache = _cache(task)
    W = np.array([[a, b] for a in range(6) for b in range(6)] * 3)[:100]  # 36 distinct
    assert np.array_equal(cache.windows_of(cache.ids(W)), W)
    assert len(set(_cache(task).ids(np.concatenate([W, W])).tolist())) == 36
    long = FunctionModel(lambda th, w: np.zeros((w.shape[0], 3)) + th[0], 1, 3, 40)
    lt = Task(model=long, theta=np.zeros(1), prompts=[(1,)], prompt_weights=[1.0], max_len=2,
              reward={"name": "count", "token": 1})
    lc = _cache(lt)
    assert not lc.exact_keys
    Wl = np.full((70, 40), 3)
    Wl[:, -1] = np.arange(70) % 3
    Wl[:, -2] = np.arange(70) // 3 % 4 - 1  # -1 pads a whole-history window
    Wl[:, 0] = np.arange(70) // 12
    lids = lc.ids(Wl)
    assert len(set(lids.tolist())) == len({tuple(r) for r in Wl.tolist()}) > 64
    assert np.array_equal(lc.windows_of(lids), Wl)


def test_per_window_arrays_match_the_plain_formulas():
    task = load_config("default")
    cache, W = _cache(task), _windows(task)
    rows = cache.rows(cache.ids(W))
    a = cache.arrays
    p, _ = model_probs(task, task.theta, W)  # (B, V)
    J = checked_sensitivities(task, W)  # (B, P, V)
    xi = J - np.einsum("bv,bpv->bp", p, J)[:, :, None]  # (B, P, V)
    assert rel(a["p"][rows], p) <= RTOL
    assert rel(a["xip"][rows], xi.transpose(0, 2, 1)) <= RTOL
    for n in range(1, 5):
        assert rel(a[f"y0_{n}"][rows], np.einsum("bv,bpv->bp", p, xi ** n),
                   np.abs(xi).max() ** n) <= RTOL
    assert rel(a["y0_2"][rows], token_fisher(p, J)) <= RTOL
    assert rel(a["uniform"][rows], uniform_token_fisher(J)) <= RTOL


@pytest.mark.parametrize("columns", [None, slice(5, 40)])
def test_a_fisher_run_of_the_mlp_forms_score_rows_from_factors(columns):
    """With nothing read per token (``quantities="fisher"``) the MLP's cache keeps no
    ``(V, P)`` scores: indexed at ``(rows, tokens)`` it forms them from the windows'
    factors, equal to the plain formulas and to the arrays of a full run's cache, and
    broadcast like an array's index. The moments are the same either way."""
    task = load_config("offpolicy_stale")  # a sampler: centers p, q and top-1
    streams = stream_specs(task, (1,))
    full = WindowCache(task, streams, True, 2 ** 26, NAMES, columns=columns)
    fisher = WindowCache(task, streams, True, 2 ** 26, {}, moments=2, columns=columns)
    assert fisher.factored and not full.factored
    assert not any(k.startswith("xi") for k in fisher.shapes)
    W = _windows(task)
    rows_f, rows = full.rows(full.ids(W)), fisher.rows(fisher.ids(W))
    cols = slice(None) if columns is None else columns
    p, _ = model_probs(task, task.theta, W)
    J = checked_sensitivities(task, W)[:, cols]  # (B, P', V)
    xi_p = (J - np.einsum("bv,bpv->bp", p, J)[:, :, None]).transpose(0, 2, 1)  # (B, V, P')
    V = task.model.vocab_size
    tok = np.arange(len(W)) % V
    for c in fisher.centers:
        got = fisher.scores(c)
        assert got.shape[1:] == full.scores(c).shape[1:]
        assert rel(got[rows, tok], full.scores(c)[rows_f, tok]) <= 1e-15
        both = got[rows[:, None], np.arange(V)[None, :]]  # (B, V, P'): every token
        assert both.shape == (len(W), V, J.shape[1])
        assert rel(both, full.scores(c)[rows_f]) <= 1e-15
    assert rel(fisher.scores("p")[rows[:, None], np.arange(V)[None, :]], xi_p) <= RTOL
    for n in (1, 2):
        for s in range(len(streams)):
            assert rel(fisher.arrays[f"y{s}_{n}"][rows], full.arrays[f"y{s}_{n}"][rows_f]) \
                <= 1e-15


class _BadDerivatives:
    """A tabular model whose sensitivities hold one non-finite entry (parameter 3, every
    window), as a model with a broken derivative would give."""

    def __init__(self, model, bad):
        self._model, self._bad = model, bad

    def __getattr__(self, name):
        return getattr(self._model, name)

    def sensitivities(self, theta, windows):
        from fisher_ref.models.sensitivities import sensitivities_autograd
        J = sensitivities_autograd(self._model, theta, windows)  # (B, P, V)
        J[:, 3, 1] = self._bad
        return J


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_non_finite_sensitivities_are_refused_by_both_engines(bad):
    """The fast engine checks j through each window's token moments (one pass fewer than a
    check of j itself); it refuses what the plain engine refuses."""
    from fisher_ref import exact
    task = load_config("tabular")
    broken = task.with_(model=_BadDerivatives(task.model, bad))
    assert np.isfinite(exact(task, progress=False).sequence_fisher).all()
    for reference in (False, True):
        with pytest.raises(ValueError, match="non-finite logit sensitivities"):
            exact(broken, progress=False, reference=reference)


def test_uniform_token_fisher_keeps_its_digits_under_a_confident_policy():
    """The spread about the uniform mean is taken from the deviations (two passes): under a
    policy sure of one token of V = 512, mean(xi^2) - mean(xi)^2 with xi centered at the
    policy's mean lost 1.5e-12 relative (V^2 eps); the two-pass form agrees with the plain
    engine to a few eps."""
    from fisher_ref import exact, task_from_json
    V = 512
    task = task_from_json({"model": {"vocab_size": V, "context": 1, "embed_dim": 2, "hidden": 2,
                                     "eos": True, "init_seed": 0, "init_scale": 1.0},
                           "prompts": [[1]], "max_len": 1, "reward": {"name": "count", "token": 2},
                           "baseline": 0.0})
    theta = task.theta.copy()
    theta[-V + 1] = 25.0  # b2 of token 1: p(1) = 1 - 2e-8
    task = task.with_(theta=theta)
    kw = dict(progress=False, keep_states=True, keep_sequences=False)
    fast, ref = exact(task, **with_options(kw)), exact(task, reference=True, **with_options(kw))
    assert fast.states["probs"].max() > 1 - 1e-7
    a, b = fast.states["uniform"], ref.states["uniform"]
    assert np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-300)) <= 1e-12


@pytest.mark.parametrize("config", ["default", "tabular"])
@pytest.mark.parametrize("budget", [2 ** 26, 1])
def test_kept_tables_are_by_window_id_whatever_the_order_and_the_flushes(config, budget):
    """The kept per-window arrays come back with row ``i`` the window of id ``i``: read from
    the cache's own rows while they are in id order and never emptied, copied by id once
    the rows are computed out of id order or the cache is emptied (``budget=1``: one
    window at a time). Each row is held to the same window's array in a cache that
    computes every window at once, in order. An MLP (``default``) and a tabular model."""
    task = load_config(config)
    kept = {"token_fisher": "y0_2", "uniform": "uniform", "score_mean": "y0_1"}
    W = np.unique(windows_for([(), (1,), (1, 2), (0, 1), (2, 2, 0), (2, 1), (2,)],
                              task.model.context, task.model.bos), axis=0)  # distinct
    n = len(W)
    assert n >= 4
    ref = _cache(task, kept=kept)
    ref_rows = ref.rows(ref.ids(W))
    for order in ([slice(0, 2), slice(2, n)], [slice(2, n), slice(0, 2)],
                  [slice(0, 1), slice(3, n), slice(1, 3)]):  # in order, then out of it
        cache = _cache(task, budget=budget, kept=kept)
        ids = cache.ids(W)  # ids 0..n-1 in order; rows computed batch by batch
        for part in order:
            cache.rows(ids[part])
        cache.flush(last=True)
        tables = cache.kept_tables()
        in_order = [part.start for part in order] == sorted(part.start for part in order)
        assert cache.by_rows == (budget > 1 and in_order)
        m2 = np.abs(ref.arrays["y0_2"][ref_rows]).max()  # E[xi | s] is 0 under the policy:
        for key, name in kept.items():  # its rows are judged on the scale of the scores
            assert tables[key].shape[0] == len(W)
            assert rel(tables[key][ids], ref.arrays[name][ref_rows],
                       np.sqrt(m2) if key == "score_mean" else m2) <= RTOL, (key, order)
