r"""The torch side: the DESIGN §2 MLP, its logit sensitivities by ``torch.func``
and the seeds' token-Fisher snippet, on any device and dtype.

Nothing here holds numerics of its own beyond torch's: the model spec, the
parameter layout, ``theta`` and the sampler's parameters come from fisher_ref;
the logits, the Jacobians and every reduction are torch operations.

- :class:`TorchMLP` — ``z = tanh(concat(E[c]) W1 + b1) W2 + b2`` as a pure
  function of the flat ``theta`` (unpacked with ``model.layout()``);
- :meth:`TorchMLP.sensitivities` — :math:`j_{i,a}(s) = \partial z_a(s)/\partial\theta_i`
  by ``vmap(jacrev(...))`` over states, ``(B, P, V)``;
- :func:`token_fisher` — :math:`f_i = \sum_a p_a (j_{i,a} - \bar j_i)^2` in the
  seeds' three lines;
- :func:`sampler_logits` — :math:`\mu`'s logits with the semantics of
  :mod:`fisher_ref.samplers` (temperature, perturbed, rounded, custom).

The exact enumeration is in :mod:`fisher_ref.torch.exact`, Monte Carlo in
:mod:`fisher_ref.torch.monte_carlo`.

Precision policy: ``dtype`` is the *compute* dtype of the logits and the
sensitivities; probabilities, Fisher terms and every sum over states and
responses are accumulated in :func:`accumulation_dtype` (``float32`` when the
compute dtype is ``bfloat16``, the compute dtype otherwise) — the usual mixed
precision recipe: low-precision matmuls, float32 reductions.
"""
from __future__ import annotations

import numpy as np
import torch
from torch.func import jacrev, vmap

from ..model import MLPModel
from ..samplers import LogitsSampler, PerturbedSampler, RoundedSampler, TemperatureSampler

__all__ = ["DTYPES", "resolve_dtype", "accumulation_dtype", "TorchMLP", "torch_model",
           "token_fisher", "state_windows", "sampler_logits"]

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_dtype(dtype):
    """``torch.dtype`` from a name (``"float64"``, ``"float32"``, ``"bfloat16"``) or a dtype."""
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"unsupported dtype {dtype}; supported: {', '.join(DTYPES)}")
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; supported: {', '.join(DTYPES)}")
    return DTYPES[dtype]


def accumulation_dtype(dtype):
    """Dtype of probabilities and sums: ``float32`` for ``bfloat16``, else ``dtype`` itself."""
    dtype = resolve_dtype(dtype)
    return torch.float32 if dtype == torch.bfloat16 else dtype


def torch_model(model, device="cpu", dtype="float64"):
    """The torch twin of a fisher_ref model, or :class:`NotImplementedError` naming its arch."""
    if not isinstance(model, MLPModel):
        arch = getattr(model, "name", type(model).__name__)
        raise NotImplementedError(
            f"the torch implementation covers the DESIGN §2 MLP (arch 'mlp_window') only; "
            f"this task's model has arch {arch!r}")
    return TorchMLP(model, device=device, dtype=dtype)


class TorchMLP:
    r"""DESIGN §2 MLP in torch: ``hid = tanh(e W1 + b1)``, ``z = hid W2 + b2``.

    Args:
        model: a :class:`fisher_ref.model.MLPModel` (spec and layout are read from it).
        device: torch device (``"cpu"``, ``"cuda"``...).
        dtype: compute dtype of logits and sensitivities.

    Example:
        >>> from fisher_ref import load_config
        >>> task = load_config("default")
        >>> tm = TorchMLP(task.model)
        >>> th = tm.theta(task.theta)
        >>> W = torch.tensor([[5, 1]])
        >>> bool(np.allclose(tm.logits(th, W).numpy(), task.model.logits(task.theta, W.numpy())))
        True
    """

    def __init__(self, model, device="cpu", dtype="float64"):
        self.model = model
        self.spec = model.spec
        self.device = torch.device(device)
        self.dtype = resolve_dtype(dtype)
        self.acc_dtype = accumulation_dtype(self.dtype)
        self.layout = model.layout()
        self.vocab_size, self.context, self.bos = model.vocab_size, model.context, model.bos
        self.eos, self.num_params = model.eos, model.num_params

    def theta(self, theta):
        """A flat numpy ``theta`` as a tensor of the compute dtype on the device, ``(P,)``."""
        return torch.as_tensor(np.asarray(theta, dtype=np.float64)).to(self.device, self.dtype)

    def unpack(self, theta):
        """Named views ``{E, W1, b1, W2, b2}`` of the flat ``theta`` (row-major)."""
        return {name: theta[off:off + int(np.prod(shape))].reshape(shape)
                for name, shape, off in self.layout}

    def logits(self, theta, windows):
        """``(B, k)`` long windows -> ``(B, V)`` logits."""
        p = self.unpack(theta)
        e = p["E"][windows].reshape(windows.shape[0], -1)  # (B, k*d)
        hid = torch.tanh(e @ p["W1"] + p["b1"])  # (B, H)
        return hid @ p["W2"] + p["b2"]  # (B, V)

    def _logits_one(self, theta, window):
        return self.logits(theta, window[None])[0]  # (V,)

    def sensitivities(self, theta, windows):
        r""":math:`j_{i,a}(s) = \partial z_a(s)/\partial\theta_i` by ``vmap(jacrev)``: ``(B, P, V)``."""
        jac = vmap(jacrev(self._logits_one), in_dims=(None, 0))(theta, windows)  # (B, V, P)
        return jac.transpose(1, 2)  # (B, P, V)


def token_fisher(logits, sens):
    r"""The seeds' snippet, batched: :math:`f_i = \sum_a p_a (j_{i,a} - \bar j_i)^2`.

    Args:
        logits: ``(..., V)``.
        sens: ``(..., P, V)``.

    Returns:
        ``(..., P)`` token Fisher of each state.

    Example:
        >>> z = torch.tensor([0.0, float(np.log(3.0))], dtype=torch.float64)
        >>> j = torch.tensor([[1.0, 0.0], [2.0, 2.0]], dtype=torch.float64)
        >>> token_fisher(z, j)
        tensor([0.1875, 0.0000], dtype=torch.float64)
    """
    probs = logits.softmax(dim=-1).unsqueeze(-2)  # (..., 1, V)
    centered = sens - (sens * probs).sum(dim=-1, keepdim=True)  # (..., P, V)
    return (probs * centered.square()).sum(dim=-1)  # (..., P)


def state_windows(tokens, lengths, context, bos):
    """Last ``context`` tokens of each state, BOS-padded, on the tokens' device: ``(B, k)``.

    Args:
        tokens: ``(B, L)`` long, ``-1`` padded.
        lengths: ``(B,)`` number of real tokens per row.
    """
    ar = torch.arange(context, device=tokens.device)
    idx = lengths[:, None] - context + ar[None, :]  # (B, k)
    win = tokens.gather(1, idx.clamp(min=0))
    return torch.where(idx >= 0, win, torch.full_like(win, bos))  # (B, k)


def sampler_logits(sampler, tmodel, theta, theta_mu, windows, z):
    r"""Logits of :math:`\mu` at the windows, as :mod:`fisher_ref.samplers` defines them.

    Args:
        sampler: a fisher_ref sampler.
        tmodel: the :class:`TorchMLP`.
        theta: policy parameters (tensor, compute dtype), ``(P,)``.
        theta_mu: ``sampler.params(model, theta)`` as a tensor (computed by fisher_ref), ``(P,)``.
        windows: ``(B, k)``.
        z: the policy's logits at ``windows``, ``(B, V)``.

    Returns:
        ``(B, V)`` logits of :math:`\mu` (no derivative is taken through them).
    """
    if isinstance(sampler, TemperatureSampler):
        return z / sampler.temperature
    if isinstance(sampler, PerturbedSampler):
        return tmodel.logits(theta_mu, windows)
    if isinstance(sampler, RoundedSampler):
        return torch.round(z, decimals=sampler.decimals)
    if isinstance(sampler, LogitsSampler):
        zq = np.asarray(sampler.logits(tmodel.model, None, windows.cpu().numpy()), dtype=float)
        return torch.as_tensor(zq).to(z.device, z.dtype)
    raise NotImplementedError(f"the torch implementation has no sampler of kind {sampler.kind!r}")
