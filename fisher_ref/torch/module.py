r"""Any torch causal language model as a fisher_ref model: :func:`from_module`.

A user's ``torch.nn.Module`` maps a batch of token-id sequences ``(b, n)`` to
next-token logits: ``(b, V')`` (the next token after each sequence), ``(b, n, V')``
(one row per position; the last is taken) or ``(b, 1, V')`` (the last position only), or
an object with such a ``.logits`` (``transformers`` models), a dict with ``"logits"``,
or a tuple whose first entry is the logits (``return_dict=False``). Columns ``0..V-1`` are the vocabulary; extra columns (a BOS
id ``V``, say) are dropped.

**theta.** :func:`from_module` flattens the selected parameters (``params=``: all of
them, the trainable ones, a list of names or a predicate; the others stay fixed at the
module's values) into one ``theta``: ``named_parameters()`` order (each tied tensor
once), each tensor row-major; :attr:`ModuleAdapter.layout` gives every block's name,
shape and offset. Integer parameters are never part of ``theta``. The module is
evaluated at any ``theta`` with ``torch.func.functional_call``, so the logits are a pure
function of the flat vector and ``vmap(jacrev)`` gives every state's
:math:`j = \partial z / \partial\theta`.

**Inputs.** A state ``s`` is read as the sequence ``[bos] + s`` (no BOS when ``bos`` is
``None``); its window is that sequence right-padded with ``-1`` to ``positions``; states
of equal length are evaluated as one unpadded batch. Ids ``0..V-1`` are generated; ids
``V..n_embeddings-1`` (system or separator tokens of a chat template) may appear in
prompts and are never generated (``n_embeddings``: the rows of the module's input
embedding, read from it when it has one).

**Precision.** Every evaluation runs under :func:`fisher_ref.torch.precision.run_dtype`:
ops the module would run below the run's dtype (the float32 casts of RMSNorm, eager
softmax and rotary embeddings in ``transformers``) run in the run's dtype, and are listed
in :attr:`ModuleAdapter.upcasts`; ``strict=True`` refuses them instead, naming the module
path and the op.

**Checks.** The first evaluation is repeated, and its first rows are evaluated alone: a
forward that is not deterministic (a stateful or random module) or whose rows depend on
the rest of the batch is refused, since the engines evaluate each state once and in
batches of other sizes. A ``(b, V', n)`` output (the length axis second) is refused.
"""
from __future__ import annotations

import copy

import numpy as np
import torch
from torch.func import functional_call, jacrev

from fisher_ref.models.base import layout_offsets
from fisher_ref.torch.adapters import JACOBIAN_CHUNK, TorchAdapter, resolve_dtype
from fisher_ref.torch.module_parameters import (flat_parameters, input_embeddings,
                                                position_table, select_parameters)
from fisher_ref.torch.precision import RANK, LowPrecisionError, prepare, run_dtype

__all__ = ["from_module", "check_eos", "ModuleAdapter", "flat_parameters", "select_parameters",
           "input_embeddings", "sampler_from_module", "LowPrecisionError"]

#: Rows of the first batch re-evaluated alone by the batch-independence check.
CHECK_ROWS = 3


def _last_logits(out, V, n, dtype):
    """``(b, V)`` next-token logits from a module's output for inputs of length ``n``."""
    out = getattr(out, "logits", out)
    if isinstance(out, dict) and "logits" in out:
        out = out["logits"]
    elif isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        out = out[0]  # a transformers model with return_dict=False: logits first
    if not isinstance(out, torch.Tensor) or out.ndim not in (2, 3):
        raise ValueError("the module must return next-token logits (b, V) or (b, n, V) "
                         f"(or an object with .logits); got {type(out).__name__} "
                         f"{tuple(getattr(out, 'shape', ()))}")
    if not out.is_floating_point():
        raise ValueError(f"the module returned {out.dtype} logits; fisher_ref needs floating "
                         "logits that depend differentiably on the parameters")
    if out.ndim == 3 and out.shape[1] not in (n, 1):
        raise ValueError(f"the module returned logits of shape {tuple(out.shape)} for inputs "
                         f"of length {n}: a 3-D output must be (b, n, V) with one row per "
                         f"position, or (b, 1, V) for the last (is it (b, V, n)? transpose it)")
    out = out[:, -1] if out.ndim == 3 else out
    if out.shape[-1] < V:
        raise ValueError(f"the module returned {out.shape[-1]} logits per state, fewer than "
                         f"vocab_size={V}")
    if RANK.get(out.dtype, 2) < RANK.get(dtype, 2):
        raise LowPrecisionError(f"the module returned {out.dtype} logits in a {dtype} run")
    return out[:, :V].to(dtype)  # (b, V): higher-precision logits (a bfloat16 run's
    # float32 head, say) come down to the run's dtype


def _vmap_hint(exc):
    return ValueError(
        f"torch.func.vmap cannot evaluate this module ({type(exc).__name__}: "
        f"{str(exc).splitlines()[0][:300]}); modules with data-dependent control flow, random "
        "ops or ops without a vmap rule (torch.nn.GRU, say) need vectorize=False (an argument "
        "of from_module, causal_lm_task and exact_causal_lm)")


class ModuleAdapter(TorchAdapter):
    """A torch module as a :class:`fisher_ref.torch.adapters.TorchAdapter` (see
    :func:`from_module`).

    Attributes:
        names, shapes: the parameter blocks of ``theta``, in order; ``layout`` the same
            with each block's offset.
        theta0: float64 numpy ``(P,)``, the module's own values of those blocks.
        n_embeddings: ids a prompt may hold (``0..n_embeddings-1``; ``V`` and up are
            input-only), ``None`` when unknown (then ``0..V-1``).
        upcasts: ``{"module.path: aten.op to float32": count}``, the ops run in the run's
            dtype instead of a lower one.
    """

    whole_history = True

    def __init__(self, module, vocab_size, eos, bos, positions, device, dtype, name, vectorize,
                 params="all", strict=False, n_embeddings=None):
        super().__init__(device, dtype)
        meta = [n for n, t in list(module.named_parameters()) + list(module.named_buffers())
                if t.is_meta]
        if meta:
            raise ValueError(f"the module's {meta[0]!r} is on the meta device (no values); "
                             "load its weights first (module.to_empty(device=...) and "
                             "load_state_dict)")
        self.names, self.shapes, self.theta0 = flat_parameters(module, params)
        self.params = list(self.names)
        self.layout = layout_offsets(list(zip(self.names, self.shapes)))
        self.vocab_size, self.eos, self.bos = int(vocab_size), bool(eos), bos
        self.context = int(positions)
        self.num_params = int(self.theta0.size)
        self.name, self.vectorize, self.strict = name, vectorize, bool(strict)
        self.n_embeddings = input_embeddings(module) if n_embeddings is None else \
            int(n_embeddings)
        self._check_inputs(position_table(module))
        self.module = prepare(copy.deepcopy(module).to(device=self.device, dtype=self.dtype),
                              self.dtype).eval()
        for p in self.module.parameters():
            p.requires_grad_(False)  # only the theta blocks are differentiated
        self.upcasts, self._unchecked = {}, {"deterministic", "batch"}

    def _check_inputs(self, table):
        E, V = self.n_embeddings, self.vocab_size
        if E is not None and E < V:
            raise ValueError(f"the module's input embedding has {E} rows, fewer than "
                             f"vocab_size={V}")
        if self.bos is not None and E is not None and self.bos >= E:
            raise ValueError(f"bos={self.bos} is not an id of the module's input embedding "
                             f"(rows 0..{E - 1}); pick a bos below {E}")
        if table is not None and self.context > table:
            raise ValueError(f"inputs need up to {self.context} positions (BOS, the longest "
                             f"prompt and max_len - 1 tokens) but the module's position table "
                             f"has max_position_embeddings={table}; shorten the prompts or "
                             "max_len")

    def check_prompt_ids(self, prompts):
        """Refuse prompt ids outside ``0..n_embeddings-1`` (``0..V-1`` when unknown) and
        a BOS id of its own (``bos >= V``; a BOS that is also a vocabulary id, as GPT-2's
        end-of-text, may appear), naming the prompt and the id."""
        top = self.vocab_size if self.n_embeddings is None else self.n_embeddings
        for i, pr in enumerate(prompts):
            for t in pr:
                if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
                    raise ValueError(f"prompt {i} holds a non-integer token {t!r}")
                if not 0 <= t < top:
                    extra = "" if top == self.vocab_size else \
                        f"; ids {self.vocab_size}..{top - 1} are input-only"
                    raise ValueError(f"prompt {i} holds token id {t}, out of range 0..{top - 1} "
                                     f"(vocab_size={self.vocab_size}{extra})")
                if t == self.bos and t >= self.vocab_size:
                    raise ValueError(f"prompt {i} holds token id {t}, the bos id: bos={t} is put "
                                     "before every input; leave it out of the prompts")

    def _evaluating(self):
        return run_dtype(self.module, self.dtype, self.strict, self.upcasts, root=self.name)

    def call(self, params, ids):
        """Next-token logits ``(b, V)`` of unpadded sequences ``ids (b, n)`` with the
        parameter blocks ``params``."""
        try:
            out = functional_call(self.module, params, (ids,))
        except IndexError as exc:
            raise ValueError(
                f"the module raised IndexError ({exc}) on inputs of length {ids.shape[1]}: an "
                f"id past its embedding (bos={self.bos}, vocab_size={self.vocab_size}) or an "
                f"input longer than its position table (positions={self.context})") from exc
        return _last_logits(out, self.vocab_size, ids.shape[1], self.dtype)

    def windows(self, tokens, lengths):
        """Row ``b`` = ``[bos] + tokens[b, :lengths[b]]``, ``-1`` padded: ``(B, positions)``."""
        B, N = lengths.shape[0], self.context
        head = 0 if self.bos is None else 1
        if B and int(lengths.max()) + head > N:
            raise ValueError(f"a state of {int(lengths.max())} tokens needs "
                             f"{int(lengths.max()) + head} positions, more than positions={N}")
        cols = torch.arange(N - head, device=tokens.device)[None, :]  # (1, N-head)
        width = min(tokens.shape[1], N - head)
        src = torch.full((B, N - head), -1, dtype=torch.long, device=tokens.device)
        src[:, :width] = tokens[:, :width]
        body = torch.where(cols < lengths[:, None], src, -1)  # (B, N-head)
        if head:
            body = torch.cat([torch.full((B, 1), self.bos, dtype=torch.long,
                                         device=tokens.device), body], dim=1)
        return body  # (B, N)

    def _groups(self, windows):
        """``(rows, ids)`` per distinct sequence length: ``(b,)`` rows and ``(b, n)`` ids."""
        n = (windows >= 0).sum(dim=1)  # (B,)
        for length in torch.unique(n).tolist():
            if length == 0:
                raise ValueError("a state is empty and the module has no bos id to start it; "
                                 "give from_module a bos")
            rows = torch.nonzero(n == length).flatten()
            yield rows, windows[rows, :length]

    def logits_of(self, params, windows):
        """``(B, N)`` windows -> ``(B, V)`` logits, one unpadded call per length."""
        out = None
        with self._evaluating():
            for rows, ids in self._groups(windows):
                z = self.call(params, ids)  # (b, V)
                out = z.new_zeros((windows.shape[0], self.vocab_size)) if out is None else out
                out = out.index_put((rows,), z)
        return out  # (B, V)

    def logits(self, theta, windows):
        """``(B, N)`` windows -> ``(B, V)`` logits at the flat ``theta``; the first calls
        also run :meth:`check_forward`."""
        z = self.logits_of(self.unpack(theta), windows)
        if self._unchecked:
            self.check_forward(theta, windows, z)
        return z

    def check_forward(self, theta, windows, z):
        """Refuse a forward whose logits ``z (B, V)`` change when evaluated again (a
        stateful or random module; on the first call) or when a row is evaluated alone
        (rows that depend on the rest of the batch; on the first call with two states of
        one length): the engines rely on neither."""
        with torch.no_grad():
            params = self.unpack(theta.detach())
            z = z.detach()
            # rounding of batched and single evaluations differs by far less than sqrt(eps)
            tol = torch.finfo(self.dtype).eps ** 0.5 * max(1.0, float(z.abs().max()))
            if "deterministic" in self._unchecked:
                self._unchecked.discard("deterministic")
                again = self.logits_of(params, windows)
                if not torch.allclose(again, z, rtol=0, atol=tol, equal_nan=True):
                    raise ValueError(
                        f"the module's forward is not deterministic: the same inputs gave "
                        f"logits {float((again - z).abs().max()):.3g} apart on two evaluations "
                        "(a stateful module, dropout, or a random op); fisher_ref needs the "
                        "logits to be a function of the parameters and the input ids")
            rows = next((r for r, _ in self._groups(windows) if len(r) > 1), None)
            if rows is None:
                return
            self._unchecked.discard("batch")
            for b in rows[:CHECK_ROWS].tolist():
                alone = self.logits_of(params, windows[b:b + 1])
                if not torch.allclose(alone, z[b:b + 1], rtol=0, atol=tol, equal_nan=True):
                    raise ValueError(
                        f"the module's logits for a sequence depend on the other sequences of "
                        f"the batch ({float((alone - z[b:b + 1]).abs().max()):.3g} apart alone "
                        "and in a batch: batch statistics, say BatchNorm in train mode); "
                        "fisher_ref evaluates states in batches of varying size")

    def sensitivities(self, theta, windows):
        r""":math:`j (B, P, V)` by ``vmap(jacrev)`` per length group (a per-window ``jacrev``
        loop for modules without vmap rules, ``vectorize=False``)."""
        params = self.unpack(theta)
        out = theta.new_zeros((windows.shape[0], self.vocab_size, self.num_params))
        with self._evaluating():
            for rows, ids in self._groups(windows):
                if self.vectorize:
                    try:
                        jac = torch.cat([self.jacobian_blocks(params, chunk)
                                         for chunk in ids.split(JACOBIAN_CHUNK)])  # (b, V, P)
                    except (RuntimeError, NotImplementedError) as exc:
                        raise _vmap_hint(exc) from exc
                else:
                    try:
                        jac = torch.stack([self._jac_loop(params, row)
                                           for row in ids])  # (b, V, P)
                    except (RuntimeError, NotImplementedError) as exc:
                        raise ValueError(
                            f"torch.func.jacrev cannot differentiate this module "
                            f"({type(exc).__name__}: {str(exc).splitlines()[0][:300]}); "
                            "fisher_ref needs a module torch.func can differentiate (an "
                            "autograd.Function needs setup_context, say)") from exc
                out[rows] = jac
        return out.transpose(1, 2)  # (B, P, V)

    def _one(self, params, ids):
        return self.call(params, ids[None])[0]  # (V,)

    def _jac_loop(self, params, ids):
        """``(V, P)`` of one sequence by ``jacrev`` without ``vmap`` over windows."""
        jac = jacrev(self._one)(params, ids)  # {name: (V, *)}
        return torch.cat([jac[n].reshape(self.vocab_size, -1) for n in params], dim=1)

    def respecified(self, device, dtype):
        """The same module, ``theta`` blocks and options on another device or dtype."""
        return ModuleAdapter(self.module, self.vocab_size, self.eos, self.bos, self.context,
                             device, dtype, self.name, self.vectorize, params=self.params,
                             strict=self.strict, n_embeddings=self.n_embeddings)


def check_eos(eos):
    """``eos`` as a bool: ``True`` or ``False`` only (numpy's bool too), never coerced.

    fisher_ref's EOS is always id 0, so ``eos`` says *whether* id 0 ends a response,
    not *which* id does. An integer (a tokenizer's ``eos_token_id``), a string or
    anything else is refused with a ``ValueError`` that says so; ``eos=0`` too, since
    ``bool(0)`` would read "EOS is id 0" as "no EOS".
    """
    if isinstance(eos, (bool, np.bool_)):
        return bool(eos)
    if isinstance(eos, (int, np.integer)):
        hint = ("if id 0 ends a response, write eos=True" if eos == 0 else
                f"a vocabulary whose EOS is id {eos} must be reordered so that EOS is id 0 "
                "(then eos=True), or write eos=False if no id ends a response early")
        raise ValueError(f"eos must be True or False (whether id 0 ends a response: "
                         f"fisher_ref's EOS is always id 0), got the integer {int(eos)}; {hint}")
    raise ValueError(f"eos must be True or False (whether id 0 ends a response: fisher_ref's "
                     f"EOS is always id 0), got {type(eos).__name__} {eos!r:.40}")


def from_module(module, vocab_size, eos, bos=None, *, positions, device="cpu",
                dtype="float64", vectorize=True, name="torch_module", params="all",
                strict=False, n_embeddings=None):
    """A torch causal LM as an adapter of the torch engines.

    Args:
        module: a ``torch.nn.Module`` mapping ``(b, n)`` token ids to next-token logits
            (see the module docstring); it is copied, moved to ``device``/``dtype`` and put
            in eval mode (the caller's module is not changed).
        vocab_size: ``V``; token ids ``0..V-1`` are generated.
        eos: whether id 0 ends a response: ``True`` or ``False`` only (fisher_ref's EOS
            is always id 0; an id such as a tokenizer's ``eos_token_id`` is refused,
            :func:`~fisher_ref.torch.module.check_eos`).
        bos: the id every input starts with (``None``: none; then no state may be empty);
            any id of the input embedding.
        positions: the longest input the module reads (BOS included).
        device, dtype: where and in what precision the module runs.
        vectorize: ``vmap(jacrev)`` over windows; ``False`` loops ``jacrev`` per window
            (for modules whose ops have no vmap rule, such as ``torch.nn.GRU``, or with
            data-dependent control flow).
        name: a label for reports.
        params: what ``theta`` is: ``"all"`` floating parameters, ``"trainable"`` (those
            with ``requires_grad``: the adapters of a PEFT/LoRA model), a list of names, or
            a predicate ``(name, param) -> bool``; the others stay fixed.
        strict: refuse an op the module runs below ``dtype`` (``LowPrecisionError`` naming
            the module path and the op) instead of running it in ``dtype``.
        n_embeddings: ids ``0..n_embeddings-1`` may appear in prompts (``V`` and up:
            input-only, never generated); default: the rows of the module's input embedding.

    Returns:
        :class:`ModuleAdapter` (``theta0``: the selected parameters as a float64 vector).
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"from_module needs a torch.nn.Module, got {type(module).__name__}")
    eos = check_eos(eos)
    for key, v in (("vocab_size", vocab_size), ("positions", positions)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{key} must be a positive integer, got {v!r}")
    for key, v in (("bos", bos), ("n_embeddings", n_embeddings)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer))
                              or v < 0):
            raise ValueError(f"{key} must be a non-negative integer or None, got {v!r}")
    return ModuleAdapter(module, vocab_size, eos, bos, positions, device, dtype, name,
                         bool(vectorize), params=params, strict=strict,
                         n_embeddings=n_embeddings)


def sampler_from_module(module, vocab_size, *, dtype="float64", strict=False):
    r"""A second causal LM as the sampler :math:`\mu` of an off-policy task (a stale copy
    of the policy, a reference model): a :class:`fisher_ref.samplers.LogitsSampler` whose
    function reads the engines' windows (``(B, positions)`` numpy ids, BOS first, ``-1``
    right-padding), evaluates ``module`` on each row's ids (rows of one length as one
    batch) in ``dtype`` throughout (:func:`fisher_ref.torch.precision.run_dtype`), and
    returns its logits ``0..vocab_size-1``, ``(B, V)`` float64.

    Args:
        module: a ``torch.nn.Module`` read as in :func:`from_module` (copied, eval mode,
            no gradients); its input ids must be the policy's.
        vocab_size: ``V``.
        dtype, strict: as in :func:`from_module`.
    """
    from fisher_ref.samplers import LogitsSampler
    run = resolve_dtype(dtype)
    copy_ = prepare(copy.deepcopy(module).to(dtype=run), run).eval()

    def logits(windows):
        W = torch.as_tensor(np.asarray(windows), dtype=torch.long)  # (B, positions)
        out = torch.empty((W.shape[0], int(vocab_size)), dtype=torch.float64)
        n = (W >= 0).sum(1)  # (B,)
        with torch.no_grad(), run_dtype(copy_, run, strict, root="sampler"):
            for length in torch.unique(n).tolist():
                rows = torch.nonzero(n == length).flatten()
                z = _last_logits(copy_(W[rows, :length]), int(vocab_size), length, run)
                out[rows] = z.to(torch.float64)
        return out.numpy()  # (B, V)

    return LogitsSampler(logits)
