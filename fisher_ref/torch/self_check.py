r"""What the torch engine says about its own result: the cheap exact identities, checked on
every run, and the layout of ``theta`` by parameter name.

These identities hold exactly on every task (docs/theory.md §2.9) and cost nothing once
the sums exist, so :func:`self_checks` runs them on every result:

- ``F = sum pi f``: the sequence Fisher :math:`E[h^2]` equals the reach-weighted token
  Fisher summed over states, judged on :math:`\max F`;
- ``gradient = autodiff``: :math:`E[(R-b)h]` equals torch autograd of the exact
  :math:`E[R]`, judged on :math:`(\sqrt{E[R^2]} + |b|)\sqrt{\max F}` (a cancellation of
  terms that large);
- ``E[h] = 0``: the on-policy score mean, judged on
  :math:`\max(\sqrt{\max F},\ T \max|j|)` (the size of the scores it sums);
- with a sampler, the first and the last again on the ``centered`` stream
  (:math:`F^\mu = \sum_s \pi_\mu f^\mu` and :math:`E_\mu[\tilde h] = 0`, docs/theory.md §3).

Each row's value is the error over its scale; the tolerance is the run's dtype's
(:data:`SELF_CHECK_TOL`: the float64, float32 and bfloat16 tolerances of
``fisher_ref.checks.tolerances``). :func:`fisher_ref.torch.exact.exact_causal_lm` raises
(:class:`SelfCheckError`) naming the module, the worst failed row and what differed;
``self_check="warn"`` warns (:class:`SelfCheckWarning`) instead and ``self_check="off"``
returns the result as it is (:data:`SELF_CHECK_MODES`).

:class:`CausalLMResult` is the result dict with the layout: ``result.by_name(name)``
returns the block of parameter ``name`` of any per-parameter array, shaped like the
parameter.
"""
from __future__ import annotations

import numpy as np

from fisher_ref.limits import TOLERANCES

__all__ = ["SELF_CHECK_TOL", "SELF_CHECK_MODES", "SelfCheckWarning", "SelfCheckError",
           "self_checks", "failed_check_text", "CausalLMResult", "check_finite"]

#: Tolerance of the self-checks per run dtype: the package's one table of dtype
#: tolerances (:data:`fisher_ref.limits.TOLERANCES`, explained in
#: :mod:`fisher_ref.checks.tolerances`).
SELF_CHECK_TOL = TOLERANCES


#: What :func:`fisher_ref.torch.exact.exact_causal_lm` does when a self-check fails:
#: raise :class:`SelfCheckError` (the default), warn, or nothing.
SELF_CHECK_MODES = ("raise", "warn", "off")

#: What each identity compares, for the message of a failed row.
_WHAT_DIFFERED = {
    "F = sum pi f": "the sequence Fisher E[h^2] and the reach-weighted token Fisher "
                    "summed over states",
    "gradient = autodiff": "the exact gradient E[(R - b) h] and torch autograd of the "
                           "exact E[R]",
    "E[h] = 0": "the on-policy score mean E[h] and 0",
}


class SelfCheckWarning(UserWarning):
    """An exact identity of a torch-engine result is off by more than its dtype allows
    (``self_check="warn"``)."""


class SelfCheckError(ValueError):
    """An exact identity of a torch-engine result is off by more than its dtype allows:
    the result is wrong (the default, ``self_check="raise"``)."""


def failed_check_text(module_name, failed, out):
    """The message of failed self-check rows ``failed`` of a result ``out`` of the module
    class ``module_name``: the worst row, what it compares, and the likely causes."""
    worst = max(failed, key=lambda r: r["value"] / r["tolerance"])
    name = worst["identity"]
    what = _WHAT_DIFFERED.get(name.replace(" (centered)", ""), name)
    return (f"exact_causal_lm: the result for module {module_name} fails its self-check: "
            f"the exact identity {name} is off by {worst['value']:.3g} relative "
            f"({what} differ), beyond the {out['dtype']} tolerance "
            f"{worst['tolerance']:.0e}; {len(failed)} of {len(out['checks'])} self-checks "
            "failed. The module's output for a window must depend only on that window "
            "and the parameters (not on the rest of its batch, not on a cast below the "
            "run's dtype); self_check='warn' or 'off' returns the result anyway, with the "
            "rows in result['checks']")


def _ratio(err, scale):
    return float(err / scale) if scale > 0 else float(err)


def self_checks(out, baseline, max_len, jmax, dtype):
    """The rows of the identities of the module docstring for a result ``out`` of
    :func:`fisher_ref.torch.exact.torch_exact`.

    Returns:
        list of dicts ``{"identity", "value", "tolerance", "passed"}``.
    """
    pol = out["streams"]["policy"]
    F, g = np.asarray(pol["sequence_fisher"]), np.asarray(pol["gradient"])
    fmax = float(np.max(np.abs(F))) if F.size else 0.0
    ER, std = float(pol["expected_reward"]), float(pol["reward_std"])
    b = ER if isinstance(baseline, str) else float(baseline)
    rows = [
        ("F = sum pi f", np.max(np.abs(F - pol["token_fisher_sum"]), initial=0.0), fmax),
        ("gradient = autodiff",
         np.max(np.abs(g - out["gradient_autodiff"]), initial=0.0),
         (np.sqrt(std ** 2 + ER ** 2) + abs(b)) * np.sqrt(fmax)),
        ("E[h] = 0", np.max(np.abs(pol["score_mean"]), initial=0.0),
         max(np.sqrt(fmax), max_len * jmax)),
    ]
    cen = out["streams"].get("centered")
    if cen is not None:  # the same two identities under the sampler (docs/theory.md §3)
        Fc = np.asarray(cen["sequence_fisher"])
        fc = float(np.max(np.abs(Fc))) if Fc.size else 0.0
        rows += [("F = sum pi f (centered)",
                  np.max(np.abs(Fc - cen["token_fisher_sum"]), initial=0.0), fc),
                 ("E[h] = 0 (centered)", np.max(np.abs(cen["score_mean"]), initial=0.0),
                  max(np.sqrt(fc), max_len * jmax))]
    tol = SELF_CHECK_TOL[dtype]
    return [{"identity": name, "value": _ratio(err, scale), "tolerance": tol,
             "passed": bool(_ratio(err, scale) <= tol)} for name, err, scale in rows]


def check_finite(out):
    """Refuse a result with a NaN or infinite array, naming the quantity (logits so large
    that their squared scores overflow the dtype, say)."""
    def walk(prefix, d):
        for k, v in d.items():
            if isinstance(v, dict):
                walk(f"{prefix}{k}.", v)
            elif v is not None and np.issubdtype(np.asarray(v).dtype, np.floating) and \
                    not np.all(np.isfinite(v)):
                raise ValueError(f"the result's {prefix}{k} is not finite (NaN or inf): the "
                                 "model's logits or sensitivities overflow the run's dtype "
                                 "when squared; rescale the model or use float64")
    walk("", {"streams": out["streams"], "gradient_autodiff": out["gradient_autodiff"]})


class CausalLMResult(dict):
    """The result dict of :func:`fisher_ref.torch.exact.exact_causal_lm`, with the layout
    of ``theta``.

    Keys as :func:`fisher_ref.torch.exact.torch_exact`, plus ``layout`` (a list of
    ``(name, shape, offset)``), ``params`` (the names), ``dtype``, ``checks`` and
    ``upcasts``.
    """

    def by_name(self, name, of="sequence_fisher", stream="policy"):
        """The block of parameter ``name`` of a per-parameter array, shaped like it.

        Args:
            name: a name of ``self["layout"]``.
            of: a quantity of ``self["streams"][stream]`` (``"sequence_fisher"``,
                ``"gradient"``, ``"cross_terms"``...), ``"gradient_autodiff"``, a key of
                ``self["states"]`` (``"token_fisher"``), or any array whose last axis is
                ``P``.

        Returns:
            ``array[..., offset:offset + n]`` reshaped to ``array.shape[:-1] + shape``.
        """
        blocks = {n: (tuple(s), o) for n, s, o in self["layout"]}
        if name not in blocks:
            close = [n for n in blocks if name in n or n.endswith(name)][:3]
            raise KeyError(f"{name!r} is not a block of theta" +
                           (f" (did you mean {close}?)" if close else
                            f"; blocks: {list(blocks)[:6]}..."))
        if isinstance(of, str):
            sources = {**{k: v for k, v in (self.get("states") or {}).items()},
                       "gradient_autodiff": self["gradient_autodiff"],
                       **self["streams"][stream]}
            if of not in sources:
                raise KeyError(f"{of!r} is not a quantity of the result")
            arr = np.asarray(sources[of])
        else:
            arr = np.asarray(of)
        P = sum(int(np.prod(s)) for s, _ in blocks.values())
        if arr.ndim == 0 or arr.shape[-1] != P:
            raise ValueError(f"by_name needs an array whose last axis is P={P}; got shape "
                             f"{arr.shape}")
        shape, off = blocks[name]
        n = int(np.prod(shape))
        return arr[..., off:off + n].reshape(arr.shape[:-1] + shape)
