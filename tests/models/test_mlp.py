"""The window MLP (fisher_ref.models.mlp): logits by hand, and saturated hidden units
without overflow warnings and with the autodiff gradient intact."""
import numpy as np

from cases import RTOL
from fisher_ref.models.base import ModelSpec
from fisher_ref.models.mlp import MLPModel


def test_mlp_logits_match_hand_computation():
    m = MLPModel(ModelSpec(vocab_size=4, context=2, embed_dim=2, hidden=3, init_seed=1))
    th = m.init_params()
    p = m.unpack(th)
    W = np.array([[4, 1], [2, 3]])  # BOS=4
    for b in range(2):
        e = np.concatenate([p["E"][W[b, 0]], p["E"][W[b, 1]]])
        z = np.tanh(e @ p["W1"] + p["b1"]) @ p["W2"] + p["b2"]
        assert np.allclose(m.logits(th, W)[b], z, rtol=RTOL, atol=0)


def test_mlp_with_huge_weights_runs_without_overflow_warnings():
    """At init_scale 1e3 every hidden unit saturates: tanh is +-1 exactly and its derivative
    0 to rounding. The autodiff gradient took autograd's 1/cosh(y)^2, which overflowed
    ("overflow encountered in cosh"); the clipped tanh gives the same values silently."""
    import warnings
    from fisher_ref import exact, load_config
    from fisher_ref.tasks import task_from_json
    spec = load_config("default").to_json()
    spec["model"]["init_scale"] = 1e3
    task = task_from_json(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = exact(task, progress=False)
    assert np.all(np.isfinite(r.gradient)) and np.all(np.isfinite(r.gradient_autodiff))
    assert np.allclose(r.gradient, r.gradient_autodiff, rtol=0, atol=1e-10 * max(1.0, np.abs(r.gradient).max()))
