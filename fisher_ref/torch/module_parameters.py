"""What :func:`fisher_ref.torch.module.from_module` reads off a ``torch.nn.Module``: the
parameters that make up ``theta`` (:func:`select_parameters`), flattened
(:func:`flat_parameters`), and the sizes of its input embedding and position table.
"""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["select_parameters", "flat_parameters", "input_embeddings", "position_table"]


def select_parameters(module, params="all"):
    """The ``(name, tensor)`` pairs of ``module`` that make up ``theta``.

    Args:
        module: a ``torch.nn.Module``.
        params: ``"all"`` (every floating parameter), ``"trainable"`` (those with
            ``requires_grad``), a list of names from ``named_parameters()``, or a
            predicate ``(name, param) -> bool``. A name of a tied tensor under any of its
            names (``lm_head.weight`` of a model with tied embeddings) selects the shared
            tensor, listed under its first name (``model.embed_tokens.weight``).

    Returns:
        list of ``(name, parameter)`` in ``named_parameters()`` order (tied once);
        integer parameters are never selected.

    Raises:
        ValueError: an unknown or integer name, an unknown ``params`` value, or an empty
            selection (naming ``params``).
    """
    named = list(module.named_parameters())
    floating = [(n, p) for n, p in named if p.is_floating_point()]
    if isinstance(params, str):
        if params not in ("all", "trainable"):
            raise ValueError(f"params must be 'all', 'trainable', a list of parameter names "
                             f"or a predicate (name, param) -> bool; got {params!r}")
        out = floating if params == "all" else [(n, p) for n, p in floating if p.requires_grad]
    elif callable(params):
        out = [(n, p) for n, p in floating if params(n, p)]
    elif isinstance(params, (list, tuple, set, frozenset)):
        have = dict(named)
        first = _first_names(module)  # every name, tied aliases included -> its first name
        want = set()
        for n in params:
            if n not in first:
                close = [k for k in first if k.endswith(str(n)) or str(n) in k][:3]
                raise ValueError(f"params names {n!r}, which is not in the module's "
                                 f"named_parameters()" + (f" (did you mean {close}?)"
                                                          if close else ""))
            n = first[n]  # a tied alias: the shared tensor, under its first name
            if not have[n].is_floating_point():
                raise ValueError(f"params names {n!r}, an integer parameter "
                                 f"({have[n].dtype}): it has no derivative")
            want.add(n)
        out = [(n, p) for n, p in floating if n in want]
    else:
        raise ValueError(f"params must be 'all', 'trainable', a list of names or a "
                         f"predicate; got {type(params).__name__}")
    if not out:
        what = "no floating parameters" if not floating else \
            f"no parameters selected by params={params!r}" if not callable(params) else \
            "no parameters selected by the params predicate"
        raise ValueError(f"the module has {what}: there is no theta to differentiate "
                         "(fisher_ref needs at least one floating parameter)")
    return out


def _first_names(module):
    """``{name: first name}`` over every parameter name of ``module``, tied aliases
    included (``named_parameters()`` lists a tied tensor once, under its first name)."""
    first, seen = {}, {}
    for n, p in module.named_parameters(remove_duplicate=False):
        first[n] = seen.setdefault(id(p), n)
    return first


def flat_parameters(module, params="all"):
    """``(names, shapes, theta)`` of the selected parameters (:func:`select_parameters`):
    ``named_parameters()`` order (a tied tensor once, under its first name), ``theta`` the
    float64 numpy concatenation, row-major."""
    named = select_parameters(module, params)
    theta = np.concatenate([p.detach().to("cpu", torch.float64).reshape(-1).numpy()
                            for _, p in named])
    return [n for n, _ in named], [tuple(p.shape) for _, p in named], theta


def input_embeddings(module):
    """Rows of the module's input embedding (``get_input_embeddings()`` of a
    ``transformers`` model, else its first ``torch.nn.Embedding``), or ``None``."""
    get = getattr(module, "get_input_embeddings", None)
    emb = None
    if callable(get):
        try:
            emb = get()
        except (NotImplementedError, AttributeError):
            emb = None
    if emb is None:
        emb = next((m for m in module.modules() if isinstance(m, torch.nn.Embedding)), None)
    weight = getattr(emb, "weight", None)
    return None if weight is None else int(weight.shape[0])


def position_table(module):
    """The longest input the module's position table covers (``max_position_embeddings``
    of a ``transformers`` config), or ``None``."""
    n = getattr(getattr(module, "config", None), "max_position_embeddings", None)
    return n if isinstance(n, int) and n > 0 else None
