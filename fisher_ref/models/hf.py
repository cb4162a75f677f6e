"""The GPT-2 of :mod:`fisher_ref.models.gpt2` as a Hugging Face ``GPT2LMHeadModel``, and back.

:func:`to_hf` builds the float64 ``transformers`` model holding the same
weights, :func:`theta_from_hf` reads ``theta`` back from one, and
:func:`hf_logits` runs it on fisher_ref states. ``torch`` and ``transformers``
(the optional extra ``hf``) are imported inside the functions, so importing
fisher_ref never needs them.
"""
from __future__ import annotations

import numpy as np

from fisher_ref.models.gpt2 import LN_EPS, GPT2Model, GPT2Spec
from fisher_ref.models.base import check_theta

__all__ = ["hf_config", "to_hf", "theta_from_hf", "spec_from_hf_config", "hf_logits"]

# Config attributes fisher_ref's GPT-2 assumes, with the values it needs.
_FIXED = {"activation_function": "gelu_new", "layer_norm_epsilon": LN_EPS,
          "tie_word_embeddings": True, "scale_attn_weights": True,
          "scale_attn_by_inverse_layer_idx": False, "add_cross_attention": False}


def hf_config(spec: GPT2Spec):
    """The ``GPT2Config`` of ``spec``: vocabulary ``V + 1`` (BOS = ``V``), eager attention,
    no dropout."""
    from transformers import GPT2Config
    return GPT2Config(
        vocab_size=spec.vocab_size + 1, n_positions=spec.n_positions, n_embd=spec.embed_dim,
        n_layer=spec.n_layer, n_head=spec.n_head, n_inner=None, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, reorder_and_upcast_attn=False,
        bos_token_id=spec.bos, eos_token_id=0 if spec.eos else None, pad_token_id=None,
        attn_implementation="eager", **_FIXED)


def to_hf(model: GPT2Model, theta):
    """A float64 ``GPT2LMHeadModel`` in eval mode whose parameters are ``theta``.

    Args:
        model: the :class:`~fisher_ref.models.gpt2.GPT2Model`.
        theta: ``(P,)`` parameters in ``named_parameters()`` order.

    Returns:
        ``transformers.GPT2LMHeadModel`` with eager attention and the head tied to ``wte``.
    """
    import torch
    from transformers import GPT2LMHeadModel
    theta = check_theta(theta, model.num_params)
    hf = GPT2LMHeadModel(hf_config(model.spec)).to(torch.float64)
    params = dict(hf.named_parameters())
    with torch.no_grad():
        for name, shape, off in model.layout():
            block = theta[off:off + int(np.prod(shape))].reshape(shape)  # (*shape)
            params[name].copy_(torch.from_numpy(block))
    if hf.lm_head.weight.data_ptr() != hf.transformer.wte.weight.data_ptr():
        raise RuntimeError("transformers did not tie lm_head.weight to transformer.wte.weight")
    return hf.eval()


def spec_from_hf_config(config, eos, init_seed=0, init_scale=1.0):
    """The :class:`GPT2Spec` of a ``GPT2Config``; ``ValueError`` names any config attribute
    whose value fisher_ref's GPT-2 does not model.

    Args:
        config: a ``transformers.GPT2Config`` (``vocab_size`` = ``V + 1``, BOS = ``V``).
        eos: whether id 0 is EOS (the config does not say it in fisher_ref's sense).
        init_seed, init_scale: recorded in the spec (they do not change the weights read).
    """
    for key, want in _FIXED.items():
        got = getattr(config, key)
        if got != want:
            raise ValueError(f"config.{key} is {got!r}; fisher_ref's GPT-2 needs {want!r}")
    if config.n_inner not in (None, 4 * config.n_embd):
        raise ValueError(f"config.n_inner is {config.n_inner}; fisher_ref's GPT-2 needs "
                         f"4 * n_embd = {4 * config.n_embd}")
    if config.vocab_size < 2:
        raise ValueError(f"config.vocab_size is {config.vocab_size}; it must be V + 1 >= 2")
    return GPT2Spec(vocab_size=config.vocab_size - 1, eos=eos, n_positions=config.n_positions,
                    embed_dim=config.n_embd, n_layer=config.n_layer, n_head=config.n_head,
                    init_seed=init_seed, init_scale=init_scale)


def theta_from_hf(hf_model, spec: GPT2Spec | None = None):
    """The flat float64 ``theta (P,)`` of a ``GPT2LMHeadModel``, in ``named_parameters()`` order.

    Args:
        hf_model: the ``transformers`` model.
        spec: if given, the config must describe this spec (``ValueError`` names the field).
    """
    built = spec_from_hf_config(hf_model.config, eos=False if spec is None else spec.eos)
    if spec is not None:
        for key in ("vocab_size", "n_positions", "embed_dim", "n_layer", "n_head"):
            if getattr(built, key) != getattr(spec, key):
                raise ValueError(f"model.{key} is {getattr(spec, key)} but the transformers "
                                 f"model has {getattr(built, key)}")
    layout = built.layout()
    named = list(hf_model.named_parameters())
    names = [n for n, _ in named]
    if names != [n for n, _, _ in layout]:
        raise ValueError(f"named_parameters() order {names} differs from the GPT-2 layout")
    return np.concatenate([p.detach().to("cpu").double().numpy().ravel() for _, p in named])


def hf_logits(hf_model, states):
    """Next-token logits ``(B, V)`` of states by ``transformers``, float64.

    Args:
        hf_model: a ``GPT2LMHeadModel`` (vocabulary ``V + 1``, BOS = ``V``).
        states: a list of token sequences (prompt plus generated tokens), or a
            ``(B, k)`` array of :meth:`GPT2Model.windows` rows (BOS first, ``-1`` padded).

    Returns:
        ``(B, V)`` numpy float64: the output at the last position of ``[BOS] + s``,
        columns ``0..V-1``. States of equal length run as one unpadded batch.
    """
    import torch
    V = hf_model.config.vocab_size - 1
    if isinstance(states, np.ndarray):
        seqs = [tuple(int(t) for t in row[1:] if t >= 0) for row in states]
    else:
        seqs = [tuple(int(t) for t in s) for s in states]
    out = np.empty((len(seqs), V))  # (B, V)
    param = next(hf_model.parameters())
    for n in sorted({len(s) for s in seqs}):
        rows = [b for b, s in enumerate(seqs) if len(s) == n]
        ids = torch.tensor([(V,) + seqs[b] for b in rows], dtype=torch.long,
                           device=param.device)  # (b, n+1)
        with torch.no_grad():
            z = hf_model(input_ids=ids).logits[:, -1, :V]  # (b, V)
        out[rows] = z.to("cpu", torch.float64).numpy()
    return out
