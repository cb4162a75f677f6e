r"""A GPT-2 causal transformer over a flat float64 ``theta``, in autograd.

The state ``s`` = prompt + generated tokens is read as the sequence
``x = [BOS] + s`` (BOS = id ``V``, at position 0), of length ``n = len(s) + 1
<= n_positions``. With ``d = embed_dim``, ``H = n_head`` heads of width
``d_h = d / H``, and LayerNorm over the last axis,

.. math::

    \mathrm{LN}(u) = w \odot (u - \bar u) / \sqrt{\sigma^2(u) + 10^{-5}} + b
    \quad(\sigma^2 \text{ the biased variance}),

the model computes, for positions ``t = 0..n-1``:

.. math::

    h^0_t &= \mathrm{wte}[x_t] + \mathrm{wpe}[t], \\
    [q, k, v] &= \mathrm{LN}_1(h^{l-1})\,W_{attn} + b_{attn}
        \quad(W_{attn}\ (d, 3d), \text{ heads split the last axis}), \\
    a_{t} &= \sum_{u \le t} \mathrm{softmax}_u\big(q_t \cdot k_u / \sqrt{d_h}\big)\, v_u
        \quad(\text{per head; concatenated}), \\
    g^l &= h^{l-1} + a\,W_{proj} + b_{proj}, \\
    h^l &= g^l + \mathrm{gelu}(\mathrm{LN}_2(g^l)\,W_{fc} + b_{fc})\,W_{mp} + b_{mp}
        \quad(W_{fc}\ (d, 4d)), \\
    z(s) &= \mathrm{LN}_f(h^{L}_{n-1})\,\mathrm{wte}^\top\ \text{columns } 0..V-1,

with ``gelu(u) = u/2 (1 + tanh(sqrt(2/pi) (u + 0.044715 u^3)))`` (GPT-2's
"gelu_new") and the head tied to the token embedding. The attention sum runs
over ``u <= t`` only, so padding after the last real position never reaches
it. This is Hugging Face's ``GPT2LMHeadModel`` with dropout off.

``theta`` holds the parameters in ``named_parameters()`` order of that model
(the tied head counted once, as ``transformer.wte.weight``), each flattened
row-major; linear weights are stored ``(in, out)``.
"""
from __future__ import annotations

from dataclasses import dataclass

import autograd.numpy as anp
import numpy as np
from autograd import jacobian

from fisher_ref.limits import MAX_CONTEXT, MAX_LAYERS, check_size, readable
from fisher_ref.models.base import (LayoutSpec, SpecModel, check_common_fields, check_param_count,
                                    check_positive_int, layout_offsets)
from fisher_ref.numerics import TANH_CLIP, softmax

__all__ = ["GPT2Spec", "GPT2Model", "gelu_new", "layer_norm"]

LN_EPS = 1e-5  # LayerNorm epsilon of GPT-2


def gelu_new(u):
    r"""GPT-2's tanh GELU: :math:`u/2\,(1 + \tanh(\sqrt{2/\pi}(u + 0.044715 u^3)))`.

    The tanh argument is clipped to ``[-20, 20]``: ``tanh`` is exactly ``±1`` in
    float64 beyond ``|y| > 19.1``, so values do not change, and autograd's
    derivative ``1/cosh^2`` no longer overflows (it is below 1e-16 there).

    Example:
        >>> float(np.round(gelu_new(np.array(1.0)), 6))
        0.841192
    """
    y = np.sqrt(2.0 / np.pi) * (u + 0.044715 * u ** 3)
    return 0.5 * u * (1.0 + anp.tanh(anp.clip(y, -TANH_CLIP, TANH_CLIP)))


def layer_norm(u, w, b):
    r"""LayerNorm over the last axis: :math:`w (u - \bar u)/\sqrt{\sigma^2 + 10^{-5}} + b`.

    ``sigma^2`` is the biased variance (divide by ``d``); ``w, b`` broadcast against ``u``.
    """
    c = u - anp.mean(u, axis=-1, keepdims=True)  # (..., d)
    var = anp.mean(c ** 2, axis=-1, keepdims=True)  # (..., 1)
    return c / anp.sqrt(var + LN_EPS) * w + b


@dataclass(frozen=True)
class GPT2Spec(LayoutSpec):
    """A GPT-2 language model, fully specified (task-file keys, plus ``arch: "gpt2"``).

    ``init_params`` draws ``theta ~ init_scale * N(0, 1)`` from
    ``numpy.random.default_rng(init_seed)`` (one draw of length ``P``).
    """

    vocab_size: int
    eos: bool = True
    n_positions: int = 8
    embed_dim: int = 8
    n_layer: int = 1
    n_head: int = 2
    init_seed: int = 0
    init_scale: float = 1.0

    def __post_init__(self):
        for name in ("vocab_size", "n_positions", "embed_dim", "n_layer", "n_head"):
            check_positive_int(getattr(self, name), f"model.{name}")
        check_size(self.n_positions, "model.n_positions", MAX_CONTEXT, "tokens a model reads")
        check_size(self.n_layer, "model.n_layer", MAX_LAYERS, "GPT-2's largest has 48")
        if self.embed_dim % self.n_head:
            raise ValueError(f"model.n_head must divide model.embed_dim, got n_head="
                             f"{self.n_head} and embed_dim={self.embed_dim}")
        check_common_fields(self.vocab_size, self.eos, self.init_seed, self.init_scale)
        V, N, d, L = (int(getattr(self, n)) for n in ("vocab_size", "n_positions",
                                                       "embed_dim", "n_layer"))
        # wte (V+1, d), wpe (N, d), per block 12 d^2 + 13 d, ln_f 2 d: before any layout
        check_param_count((V + 1) * d + N * d + L * (12 * d * d + 13 * d) + 2 * d, "gpt2",
                          f"vocab_size={readable(V)}, n_positions={N}, embed_dim={readable(d)}, "
                          f"n_layer={L}")

    def layout(self):
        """List of ``(name, shape, offset)``, in ``named_parameters()`` order."""
        V, N, d = self.vocab_size, self.n_positions, self.embed_dim
        shapes = [("transformer.wte.weight", (V + 1, d)), ("transformer.wpe.weight", (N, d))]
        for i in range(self.n_layer):
            h = f"transformer.h.{i}."
            shapes += [(h + "ln_1.weight", (d,)), (h + "ln_1.bias", (d,)),
                       (h + "attn.c_attn.weight", (d, 3 * d)), (h + "attn.c_attn.bias", (3 * d,)),
                       (h + "attn.c_proj.weight", (d, d)), (h + "attn.c_proj.bias", (d,)),
                       (h + "ln_2.weight", (d,)), (h + "ln_2.bias", (d,)),
                       (h + "mlp.c_fc.weight", (d, 4 * d)), (h + "mlp.c_fc.bias", (4 * d,)),
                       (h + "mlp.c_proj.weight", (4 * d, d)), (h + "mlp.c_proj.bias", (d,))]
        shapes += [("transformer.ln_f.weight", (d,)), ("transformer.ln_f.bias", (d,))]
        return layout_offsets(shapes)

    def to_json(self):
        return {"vocab_size": self.vocab_size, "eos": self.eos,
                "n_positions": self.n_positions, "embed_dim": self.embed_dim,
                "n_layer": self.n_layer, "n_head": self.n_head,
                "init_seed": self.init_seed, "init_scale": self.init_scale}


class GPT2Model(SpecModel):
    """The GPT-2 of the module docstring; a state's window is ``[BOS] + s``, ``-1`` padded.

    Example:
        >>> m = GPT2Model(GPT2Spec(vocab_size=5, n_positions=8, embed_dim=8, n_layer=1, n_head=2))
        >>> m.num_params, m.bos, m.context
        (1000, 5, 8)
        >>> w = m.windows(np.array([[3, 1], [2, -1]]), np.array([2, 1]))
        >>> w.tolist()
        [[5, 3, 1, -1, -1, -1, -1, -1], [5, 2, -1, -1, -1, -1, -1, -1]]
        >>> m.logits(m.init_params(), w).shape
        (2, 5)
    """

    name = "gpt2"

    def __init__(self, spec: GPT2Spec):
        super().__init__(spec)
        self.context = spec.n_positions

    def check_lengths(self, longest_prompt, max_len):
        """Refuse a task whose longest state would not fit: ``len(prompt) + max_len``
        positions (BOS plus at most ``max_len - 1`` generated tokens after the prompt)
        must be at most ``n_positions``."""
        if longest_prompt + max_len > self.context:
            raise ValueError(
                f"the longest prompt ({longest_prompt} tokens) plus max_len ({max_len}) is "
                f"{longest_prompt + max_len}, more than model.n_positions={self.context}: "
                "GPT-2 reads BOS plus the whole history, so len(prompt) + max_len <= "
                "n_positions is required")

    def windows(self, tokens, lengths):
        """Row ``b`` = ``[BOS] + tokens[b, :lengths[b]]``, ``-1`` padded: ``(B, n_positions)``.

        Raises ``ValueError`` when a state needs more than ``n_positions`` positions.
        """
        tokens, lengths = np.asarray(tokens), np.asarray(lengths, dtype=np.int64)
        B, N = lengths.shape[0], self.context
        if B and lengths.max() + 1 > N:
            raise ValueError(f"a state of {lengths.max()} tokens needs {lengths.max() + 1} "
                             f"positions with BOS, more than model.n_positions={N}")
        cols = np.arange(N - 1)[None, :]  # (1, N-1)
        src = tokens[:, :N - 1] if tokens.shape[1] >= N - 1 else np.pad(
            tokens, ((0, 0), (0, N - 1 - tokens.shape[1])), constant_values=-1)  # (B, N-1)
        body = np.where(cols < lengths[:, None], src, -1)  # (B, N-1)
        return np.concatenate([np.full((B, 1), self.bos), body], axis=1).astype(np.int64)

    def logits(self, theta, windows):
        """Next-token logits ``z (B, V)`` of windows ``(B, n_positions)``."""
        return self._logits(anp.reshape(theta, (1, -1)), windows)  # (B, V)

    def sensitivities(self, theta, windows):
        r"""``j (B, P, V)``, :math:`j_{i,a}(s_b) = \partial z_a(s_b) / \partial\theta_i`.

        Each state gets its own copy of ``theta`` (a ``(B, P)`` stack); the
        gradient of :math:`\sum_b z_a(s_b)` with respect to the stack holds every
        state's gradient in its own row, so ``V`` reverse passes give all of ``j``.
        """
        B = windows.shape[0]
        stack = np.tile(np.asarray(theta, dtype=float), (B, 1))  # (B, P)
        jac = jacobian(lambda th: anp.sum(self._logits(th, windows), axis=0))(stack)  # (V, B, P)
        return np.ascontiguousarray(np.transpose(jac, (1, 2, 0)))  # (B, P, V)

    def _logits(self, thetas, windows):
        """Logits for ``thetas (Q, P)``, ``Q`` 1 (shared) or ``B`` (one per state): ``(B, V)``."""
        p = self.unpack(thetas)  # each (Q, *shape)
        windows = np.asarray(windows)
        B, Q = windows.shape[0], thetas.shape[0]
        n = np.sum(windows >= 0, axis=1)  # (B,) real positions, BOS included
        T = int(n.max(initial=1))
        x = np.where(windows[:, :T] >= 0, windows[:, :T], self.bos)  # (B, T) pads read as BOS
        row = np.arange(B)[:, None] if Q > 1 else np.zeros((B, 1), dtype=int)  # (B, 1)
        wte = p["transformer.wte.weight"]  # (Q, V+1, d)
        h = wte[row, x] + p["transformer.wpe.weight"][:, :T]  # (B, T, d)
        for i in range(self.spec.n_layer):
            h = self._block(h, p, f"transformer.h.{i}.")  # (B, T, d)
        last = h[np.arange(B), n - 1]  # (B, d)
        last = layer_norm(last, p["transformer.ln_f.weight"], p["transformer.ln_f.bias"])
        z = anp.matmul(last[:, None, :], anp.swapaxes(wte, 1, 2))[:, 0]  # (B, V+1)
        return z[:, :self.vocab_size]  # (B, V)

    def _block(self, h, p, pre):
        """One pre-LN block: ``h + attn(LN1 h)``, then ``+ mlp(LN2 .)``: ``(B, T, d)``."""
        def lin(u, name):  # u (B, T, m) @ W (Q, m, n) + b (Q, n)
            return anp.matmul(u, p[pre + name + ".weight"]) + p[pre + name + ".bias"][:, None]

        def ln(u, name):  # weight, bias (Q, d) -> (Q, 1, d)
            w, b = p[pre + name + ".weight"], p[pre + name + ".bias"]
            return layer_norm(u, w[:, None], b[:, None])

        h = h + lin(self._attention(lin(ln(h, "ln_1"), "attn.c_attn")), "attn.c_proj")
        return h + lin(gelu_new(lin(ln(h, "ln_2"), "mlp.c_fc")), "mlp.c_proj")  # (B, T, d)

    def _attention(self, qkv):
        """Causal multi-head attention of ``qkv (B, T, 3d)``: ``(B, T, d)``."""
        B, T, d3 = qkv.shape
        d, H = d3 // 3, self.spec.n_head

        def heads(u):  # (B, T, d) -> (B, H, T, d/H)
            return anp.transpose(anp.reshape(u, (B, T, H, d // H)), (0, 2, 1, 3))

        q, k, v = heads(qkv[..., :d]), heads(qkv[..., d:2 * d]), heads(qkv[..., 2 * d:])
        scores = anp.matmul(q, anp.swapaxes(k, 2, 3)) / np.sqrt(d // H)  # (B, H, T, T)
        causal = np.tril(np.ones((T, T), dtype=bool))  # (T, T) key u <= query t
        att = softmax(anp.where(causal, scores, -np.inf))  # (B, H, T, T)
        out = anp.matmul(att, v)  # (B, H, T, d/H)
        return anp.reshape(anp.transpose(out, (0, 2, 1, 3)), (B, T, d))  # (B, T, d)
