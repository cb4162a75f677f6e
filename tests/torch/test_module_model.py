"""A torch module as a model of the numpy engines (fisher_ref.torch.module_model): the
numpy engine agrees with the torch engine off policy, verify's exact identities hold, and
the layout places each parameter block where theta holds it."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch engine needs torch (the torch extra)")

from fisher_ref.engine.fast import exact  # noqa: E402
from fisher_ref.samplers import TemperatureSampler  # noqa: E402
from fisher_ref.torch.exact import STREAM_QUANTITIES, torch_exact  # noqa: E402
from fisher_ref.torch.module_model import causal_lm_task  # noqa: E402
from tests.torch.test_module import RTOL, CausalConvLM, rel, reward  # noqa: E402

pytestmark = pytest.mark.torch


def test_numpy_engine_runs_the_same_module_and_agrees_off_policy():
    """The numpy engine reads the module through an autograd primitive (torch.autograd
    vector-Jacobian products); the torch engine by vmap(jacrev): both agree at 1e-10 on
    every stream of an off-policy task."""
    torch.manual_seed(3)
    task = causal_lm_task(CausalConvLM(3).double(), [[1], [2, 2]], 3, reward, vocab_size=3,
                          eos=True, bos=3, sampler=TemperatureSampler(1.7), baseline="mean")
    ref, out = exact(task, progress=False), torch_exact(task)
    assert set(out["streams"]) == {"policy", "raw", "centered"}
    for s, d in out["streams"].items():
        for q in STREAM_QUANTITIES:
            b = getattr(ref.streams[s], q)
            if q in ("score_mean", "correlation"):
                continue  # judged on their parts' scale in test_torch_exact
            assert rel(d[q], b) <= RTOL, (s, q, rel(d[q], b))
    assert rel(out["gradient_autodiff"], ref.gradient_autodiff) <= RTOL


def test_verify_runs_on_a_module_task():
    """The numpy engines run a user's module too: every exact identity of verify holds."""
    from fisher_ref.checks.identities import verify_task
    torch.manual_seed(5)
    task = causal_lm_task(CausalConvLM(3), [[1], [2]], 3, reward, vocab_size=3, eos=True,
                          bos=3, baseline="mean")
    _, rows = verify_task(task, mc=0, progress=False)
    failed = [r.check for r in rows if r.kind != "info" and not r.passed]
    assert rows and not failed, failed


def test_layout_places_each_parameter_block_where_theta_holds_it():
    """``model.layout()`` (read by golden files, hf and the lessons) gives each block's
    offset in theta: the block read there is the module's own parameter."""
    torch.manual_seed(0)
    module = CausalConvLM(4)
    task = causal_lm_task(module, [[1]], 2, reward, vocab_size=4, eos=True)
    named = dict(module.named_parameters())
    theta, end = task.theta, 0
    for name, shape, off in task.model.layout():
        n = int(np.prod(shape))
        assert off == end, name  # blocks one after another
        expect = named[name].detach().double().numpy()
        assert np.array_equal(theta[off:off + n].reshape(shape), expect), name
        end = off + n
    assert end == task.model.num_params
