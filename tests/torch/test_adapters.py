"""Torch adapters (fisher_ref.torch.adapters, fisher_ref.torch.module): logits and
sensitivities against fisher_ref's numpy models, the token-Fisher snippet, dtypes."""
import doctest
import importlib
import pkgutil

import fisher_ref.torch

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch engine needs torch (the torch extra)")

from fisher_ref import load_config  # noqa: E402
from fisher_ref.checks.tolerances import rel_error  # noqa: E402
from fisher_ref.models.mlp import MLPModel
from fisher_ref.models.base import ModelSpec
from fisher_ref.models.tabular import TabularModel
from fisher_ref.models.sensitivities import sensitivities  # noqa: E402
from fisher_ref.numerics import token_fisher as np_token_fisher  # noqa: E402
from fisher_ref.torch.adapters import TorchMLP, TorchTabular, resolve_dtype, token_fisher
from fisher_ref.torch.registry import torch_model

pytestmark = pytest.mark.torch

RTOL = 1e-10  # float64 against float64


def _windows(model, states):
    from fisher_ref.models.base import model_windows
    return model_windows(model, states)


@pytest.mark.parametrize("config", ["default", "tabular", "gpt2_small", "gpt2_offpolicy"])
def test_adapter_logits_and_sensitivities_match_the_numpy_model(config):
    task = load_config(config)
    m = task.model
    states = [p + g for p in task.prompts for g in [(), (1,), (2, 1)]
              if len(p) + len(g) < len(max(task.prompts, key=len)) + task.max_len]
    W = _windows(m, states)  # (B, k)
    ad = torch_model(m)
    th, Wt = ad.theta(task.theta), torch.as_tensor(W)
    np.testing.assert_array_equal(ad.windows(*_tokens(states)).numpy(), W)
    _, rel = rel_error(ad.logits(th, Wt).numpy(), m.logits(task.theta, W))
    assert rel <= RTOL
    J = ad.sensitivities(th, Wt).numpy()  # (B, P, V)
    assert J.shape == (len(states), m.num_params, m.vocab_size)
    _, rel = rel_error(J, sensitivities(m, task.theta, W))
    assert rel <= RTOL


def _tokens(states):
    L = max(len(s) for s in states) + 1
    tok = torch.full((len(states), L), -1, dtype=torch.long)
    for b, s in enumerate(states):
        tok[b, :len(s)] = torch.tensor(s, dtype=torch.long)
    return tok, torch.tensor([len(s) for s in states])


def test_jacrev_sensitivities_match_closed_form_on_random_windows():
    model = MLPModel(ModelSpec(vocab_size=6, context=3, embed_dim=2, hidden=5))
    theta = np.random.default_rng(0).standard_normal(model.num_params)
    W = np.random.default_rng(1).integers(0, 7, size=(11, 3))  # BOS id 6 included
    tm = TorchMLP(model)
    got = tm.sensitivities(tm.theta(theta), torch.as_tensor(W)).numpy()  # (B, P, V)
    _, rel = rel_error(got, sensitivities(model, theta, W))
    assert rel <= RTOL


def test_tabular_adapter_reads_the_row_of_each_window():
    m = TabularModel(3, context=2, init_seed=1)
    theta = m.init_params()
    W = np.array([[3, 3], [2, 0], [1, 2]])
    z = TorchTabular(m).logits(torch.as_tensor(theta), torch.as_tensor(W)).numpy()
    np.testing.assert_array_equal(z, theta.reshape(16, 3)[[15, 8, 6]])


def test_token_fisher_snippet_matches_fisher_ref():
    rng = np.random.default_rng(2)
    z = 3.0 * rng.standard_normal((7, 4))  # (B, V)
    sens = rng.standard_normal((7, 9, 4))  # (B, P, V)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    got = token_fisher(torch.as_tensor(z), torch.as_tensor(sens)).numpy()
    _, rel = rel_error(got, np_token_fisher(p, sens))
    assert rel <= RTOL


def test_unknown_dtype_is_refused():
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        resolve_dtype("float8")


TORCH_MODULES = sorted(m.name for m in pkgutil.walk_packages(fisher_ref.torch.__path__, "fisher_ref.torch."))


@pytest.mark.parametrize("name", TORCH_MODULES)
def test_docstring_examples(name):
    mod = importlib.import_module(name)
    res = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert res.failed == 0, f"{res.failed}/{res.attempted} in {name}"


def test_the_torch_twin_has_docstring_examples():
    total = sum(doctest.testmod(importlib.import_module(n), optionflags=doctest.ELLIPSIS).attempted
                for n in TORCH_MODULES)
    assert total > 0
