r"""Torch adapters: a model as a pure function of a flat ``theta`` tensor, its logit
sensitivities by ``torch.func``, the three-line token Fisher and the samplers' logits.

The torch engines (:mod:`fisher_ref.torch.exact`, :mod:`fisher_ref.torch.monte_carlo`)
see a model only through a small *adapter* (:class:`TorchAdapter`):

- ``vocab_size`` ``V``, ``eos`` (id 0 ends a response), ``bos`` (the id a state's input
  starts with, or ``None``), ``num_params`` ``P``, ``context`` (width of a window);
- ``windows(tokens, lengths)``: ``(B, L)`` and ``(B,)`` long tensors -> ``(B, k)`` long,
  what the model reads at each state;
- ``unpack(theta)`` -> ``{name: view}``, the named blocks of the flat ``theta``, and
  ``logits_of(params, windows)`` -> ``(B, V)``, the logits from those blocks; so
  ``logits(theta, windows)`` is a pure function of the flat ``theta``;
- ``sensitivities(theta, windows)`` -> ``(B, P, V)``,
  :math:`j_{i,a}(s) = \partial z_a(s)/\partial\theta_i`, by ``vmap(jacrev)`` over
  windows (in chunks of :data:`JACOBIAN_CHUNK`) with respect to the named blocks, then
  laid out flat (differentiating the slices of a flat vector instead would write a
  zero-filled ``P``-vector per block, window and logit).

Shipped adapters: :class:`TorchMLP` (``z = tanh(concat(E[c]) W1 + b1) W2 + b2``),
:class:`TorchTabular` (the logits are the parameters) and, in
:mod:`fisher_ref.torch.module`, any ``torch.nn.Module`` (the GPT-2 through
``transformers`` among them). :func:`torch_model` picks the adapter of a fisher_ref model.

Precision policy: ``dtype`` is the *compute* dtype of the logits and the sensitivities;
probabilities, Fisher terms and every sum over states and responses are accumulated in
:func:`accumulation_dtype` (``float32`` when the compute dtype is ``bfloat16``, the compute
dtype otherwise) — low-precision model arithmetic, float32 reductions.
"""
from __future__ import annotations

import numpy as np
import torch
from torch.func import jacrev, vmap

from fisher_ref.samplers import LogitsSampler, PerturbedSampler, RoundedSampler, TemperatureSampler

__all__ = ["DTYPES", "JACOBIAN_CHUNK", "resolve_dtype", "accumulation_dtype", "TorchAdapter",
           "TorchMLP", "TorchTabular", "check_device", "token_fisher", "state_windows",
           "sampler_logits"]

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
#: Windows per ``vmap(jacrev)`` call (bounds the memory of one Jacobian batch).
JACOBIAN_CHUNK = 256


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


def check_device(device):
    """``torch.device(device)``, refusing one this torch cannot use (``ValueError`` naming
    it): CUDA without a CUDA build or GPU, MPS without MPS, the meta device (no values)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device={device!r} is not a torch device ({exc})") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but torch.cuda.is_available() is False (torch "
                         f"{torch.__version__}: a CPU build, or no GPU visible); use "
                         "device='cpu'")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device={device!r} but torch.backends.mps.is_available() is False; "
                         "use device='cpu'")
    if dev.type == "meta":
        raise ValueError("device='meta' holds no values; use 'cpu' or 'cuda'")
    return dev


class TorchAdapter:
    """Base of the adapters: device, dtypes, ``theta`` conversion and ``vmap(jacrev)``.

    A subclass sets ``vocab_size, eos, bos, num_params, context`` and ``layout`` (the
    ``(name, shape, offset)`` blocks of ``theta``) and defines ``windows`` and
    ``logits_of``. ``whole_history`` is True when a window holds the whole
    state (no two states share one), so per-window caching is pointless.
    """

    whole_history = False
    name = "adapter"

    def __init__(self, device="cpu", dtype="float64"):
        self.device = check_device(device)
        self.dtype = resolve_dtype(dtype)
        self.acc_dtype = accumulation_dtype(self.dtype)

    def theta(self, theta):
        """A flat numpy ``theta`` as a tensor of the compute dtype on the device, ``(P,)``."""
        return torch.as_tensor(np.asarray(theta, dtype=np.float64)).to(self.device, self.dtype)

    def windows(self, tokens, lengths):  # pragma: no cover - abstract
        raise NotImplementedError

    def unpack(self, theta):
        """Named views of the flat ``theta`` (row-major), from ``layout``."""
        return {name: theta[off:off + int(np.prod(shape))].reshape(shape)
                for name, shape, off in self.layout}

    def logits_of(self, params, windows):  # pragma: no cover - abstract
        raise NotImplementedError

    def logits(self, theta, windows):
        """``(B, k)`` windows -> ``(B, V)`` logits at the flat ``theta``."""
        return self.logits_of(self.unpack(theta), windows)

    def _one(self, params, window):
        return self.logits_of(params, window[None])[0]  # (V,)

    def jacobian_blocks(self, params, windows):
        """``(b, V, P)``: ``vmap(jacrev)`` over ``windows (b, k)`` w.r.t. every block, flat."""
        jac = vmap(jacrev(self._one), in_dims=(None, 0))(params, windows)  # {name: (b, V, *)}
        b = windows.shape[0]
        return torch.cat([jac[n].reshape(b, self.vocab_size, -1) for n in params], dim=2)

    def sensitivities(self, theta, windows):
        r""":math:`j_{i,a}(s) = \partial z_a(s)/\partial\theta_i` by ``vmap(jacrev)``: ``(B, P, V)``."""
        params = self.unpack(theta)
        parts = [self.jacobian_blocks(params, w) for w in windows.split(JACOBIAN_CHUNK)]
        if not parts:
            return theta.new_zeros((0, self.num_params, self.vocab_size))
        return torch.cat(parts).transpose(1, 2)  # (B, P, V)


def state_windows(tokens, lengths, context, bos):
    """Last ``context`` tokens of each state, BOS-padded, on the tokens' device: ``(B, k)``.

    Args:
        tokens: ``(B, L)`` long, ``-1`` padded.
        lengths: ``(B,)`` number of real tokens per row.
    """
    ar = torch.arange(context, device=tokens.device)
    idx = lengths[:, None] - context + ar[None, :]  # (B, k)
    if tokens.shape[1] == 0:
        return torch.full(idx.shape, bos, dtype=torch.long, device=tokens.device)
    win = tokens.gather(1, idx.clamp(min=0))
    return torch.where(idx >= 0, win, torch.full_like(win, bos))  # (B, k)


class _WindowAdapter(TorchAdapter):
    """An adapter over a fisher_ref window model (the last ``context`` tokens, BOS-padded)."""

    def __init__(self, model, device="cpu", dtype="float64"):
        super().__init__(device, dtype)
        self.model = model
        self.vocab_size, self.context, self.bos = model.vocab_size, model.context, model.bos
        self.eos, self.num_params = model.eos, model.num_params
        self.layout = model.layout()

    def windows(self, tokens, lengths):
        return state_windows(tokens, lengths, self.context, self.bos)  # (B, k)


class TorchMLP(_WindowAdapter):
    r"""The MLP window model in torch: ``hid = tanh(e W1 + b1)``, ``z = hid W2 + b2``.

    Args:
        model: a :class:`fisher_ref.models.mlp.MLPModel` (spec and layout are read from it).
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

    name = "mlp_window"

    def logits_of(self, p, windows):
        """``(B, k)`` long windows -> ``(B, V)`` logits from the blocks ``E, W1, b1, W2, b2``."""
        e = p["E"][windows].reshape(windows.shape[0], -1)  # (B, k*d)
        hid = torch.tanh(e @ p["W1"] + p["b1"])  # (B, H)
        return hid @ p["W2"] + p["b2"]  # (B, V)


class TorchTabular(_WindowAdapter):
    """The tabular model in torch: row ``sum_p c_p (V+1)^(k-p)`` of ``theta`` as ``((V+1)^k, V)``."""

    name = "tabular"

    def logits_of(self, params, windows):
        base = (self.vocab_size + 1) ** torch.arange(self.context - 1, -1, -1,
                                                     device=windows.device)  # (k,)
        return params["table"][(windows * base).sum(-1)]  # (B, V)


def token_fisher(logits, sens):
    r"""The three-line token Fisher, batched: :math:`f_i = \sum_a p_a (j_{i,a} - \bar j_i)^2`.

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


def sampler_logits(sampler, adapter, theta, theta_mu, windows, z):
    r"""Logits of :math:`\mu` at the windows, as :mod:`fisher_ref.samplers` defines them.

    Args:
        sampler: a fisher_ref sampler.
        adapter: the model's :class:`TorchAdapter`.
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
        return adapter.logits(theta_mu, windows)
    if isinstance(sampler, RoundedSampler):
        return torch.round(z, decimals=sampler.decimals)
    if isinstance(sampler, LogitsSampler):
        zq = np.asarray(sampler.logits(None, None, windows.cpu().numpy()), dtype=float)
        return torch.as_tensor(zq).to(z.device, z.dtype)
    raise NotImplementedError(f"the torch engine has no sampler of kind {sampler.kind!r}")
