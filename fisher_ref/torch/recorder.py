r"""The gradient a Hugging Face trainer applies, step by step: :class:`GradientRecorder`.

A ``transformers.TrainerCallback`` that copies ``p.grad`` of every trained parameter at
``on_pre_optimizer_step``: after the backward passes of all accumulated micro-batches and
after clipping, just before the optimizer reads them, so what it records is what the
optimizer would apply. The run must leave the weights where they are, so that every step
draws from the same policy: it refuses a learning rate above 0 or gradient clipping when
training begins, and checks at every step that no weight moved. It keeps running sums and
(by default) every step's gradient, up to a memory cap. Feed it to
:func:`fisher_ref.testing.check_applied_gradient`.
"""
from __future__ import annotations

import numpy as np
import torch
from transformers import TrainerCallback

__all__ = ["GradientRecorder", "DEFAULT_MAX_BYTES"]

#: The memory for the kept steps (float64), 256 MiB.
DEFAULT_MAX_BYTES = 256 * 2 ** 20


class GradientRecorder(TrainerCallback):
    """Record the gradient a ``transformers.Trainer`` (``trl.GRPOTrainer``, ...) applies.

    Args:
        keep_samples: keep every step's gradient (the scale's standard error needs them);
            ``False`` keeps the running sums only.
        max_bytes: memory cap for the kept steps; past it the next step raises.

    Attributes:
        names: the trained parameters, ``named_parameters()`` order.
        layout: ``[(name, shape, offset)]`` of the flat gradient.
        steps: steps recorded.

    Raises:
        ValueError: when training begins, a learning rate above 0, ``max_grad_norm > 0``
            or a model with no trained parameter; at a step, a weight that moved.

    Example (not run here)::

        rec = GradientRecorder()
        trainer = GRPOTrainer(..., args=GRPOConfig(learning_rate=0.0, max_grad_norm=0.0, ...),
                              callbacks=[rec])
        trainer.train()
        check_applied_gradient(rec, exact, layout=rec.layout).assert_ok()
    """

    def __init__(self, keep_samples=True, max_bytes=DEFAULT_MAX_BYTES):
        if not isinstance(keep_samples, bool):
            raise TypeError(f"keep_samples must be True or False, got {keep_samples!r}")
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, (int, float)) \
                or not max_bytes > 0:
            raise ValueError(f"max_bytes must be a number > 0, got {max_bytes!r}")
        self.keep_samples, self.max_bytes = keep_samples, max_bytes
        self.names, self.layout, self.steps = [], [], 0
        self._params, self._frozen, self._sum, self._sumsq, self._kept = [], None, None, None, []

    def _attach(self, model):
        if self._params:
            return
        if model is None:
            raise ValueError("GradientRecorder needs the trainer's model (none was passed)")
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError("the model has no trained parameter (requires_grad=True): "
                             "nothing to record")
        self.names = [n for n, _ in named]
        self._params = [p for _, p in named]
        off, self.layout = 0, []
        for n, p in named:
            self.layout.append((n, tuple(p.shape), off))
            off += p.numel()
        self._frozen = self._flat([p.detach() for p in self._params])
        self._sum, self._sumsq = np.zeros(off), np.zeros(off)

    @staticmethod
    def _flat(tensors):
        return np.concatenate([t.detach().reshape(-1).to("cpu", torch.float64).numpy()
                               for t in tensors])

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if args.learning_rate > 0:
            raise ValueError(f"learning_rate={args.learning_rate}: the weights would move "
                             f"between steps; set learning_rate=0.0 to record the gradient of "
                             f"one policy")
        if args.max_grad_norm is not None and args.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm={args.max_grad_norm}: the trainer would clip the "
                             f"gradients it applies; set max_grad_norm=0.0")
        self._attach(model)

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self._attach(model)
        now = self._flat([p.detach() for p in self._params])
        if not np.array_equal(now, self._frozen):
            moved = int(np.count_nonzero(now != self._frozen))
            raise ValueError(f"{moved} weights moved since the first step: the steps would not "
                             f"draw from one policy; set learning_rate=0.0 (and weight_decay "
                             f"has no effect then)")
        g = self._flat([torch.zeros_like(p) if p.grad is None else p.grad
                        for p in self._params])  # (P,)
        if self.keep_samples:
            if (len(self._kept) + 1) * g.nbytes > self.max_bytes:
                raise MemoryError(f"GradientRecorder keeps {len(self._kept)} steps of "
                                  f"{g.size} parameters, max_bytes={self.max_bytes}: raise "
                                  f"max_bytes, or keep_samples=False for the running sums only")
            self._kept.append(g)
        self._sum += g
        self._sumsq += g * g
        self.steps += 1

    def running_sums(self):
        """``(sum (P,), sum of squares (P,), steps)`` of the recorded gradients."""
        if self._sum is None:
            raise ValueError("the recorder has recorded no step")
        return self._sum.copy(), self._sumsq.copy(), self.steps

    def samples(self):
        """``(steps, P)`` the recorded gradients, or ``None`` (``keep_samples=False``)."""
        if not self.keep_samples:
            return None
        return np.stack(self._kept) if self._kept else np.zeros((0, len(self._frozen)))
