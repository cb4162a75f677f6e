"""Tasks: a model with parameters, weighted prompts, a length, a reward, a
baseline and an optional sampler — everything the engines enumerate or sample.

Tasks load from the plain JSON of DESIGN §5::

    {"model": {"vocab_size": 5, "context": 2, "embed_dim": 3, "hidden": 8,
               "eos": true, "init_seed": 0, "init_scale": 1.0},
     "prompts": [[1, 2], [3]], "prompt_weights": [0.5, 0.5], "max_len": 3,
     "reward": {"name": "count", "token": 2}, "baseline": 0.0,
     "sampler": {"kind": "temperature", "temperature": 1.5}}

``prompt_weights`` defaults to uniform, ``baseline`` to 0 (a number, or
``"mean"`` for the exact mean reward), ``reward`` to the count of token 1,
``sampler`` to none; an optional ``theta`` list fixes the parameters.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from .architectures import make_model
from .model import check_theta
from .rewards import Reward, make_reward
from .samplers import Sampler, make_sampler

__all__ = ["Task", "task_from_json", "load_task", "load_config", "list_configs"]

TASK_KEYS = {"model", "prompts", "prompt_weights", "max_len", "reward", "baseline",
             "sampler", "theta", "name", "description"}
WEIGHT_SUM_TOL = 1e-9


@dataclass
class Task:
    """A fully specified enumeration/sampling task.

    Attributes:
        model: a model object (``logits(theta, windows)``, ``vocab_size``, ``context``,
            ``eos``, ``bos``, ``num_params``).
        theta: float64 ``(P,)`` policy parameters.
        prompts: tuple of token tuples (the empty prompt allowed).
        prompt_weights: float64 ``(n_prompts,)``, non-negative, summing to 1.
        max_len: longest response ``T``.
        reward: ``R(prompt, response) -> float``.
        baseline: a constant, or ``"mean"`` for the exact mean reward.
        sampler: ``mu`` for off-policy sampling, or ``None`` (on-policy).
    """

    model: object
    theta: np.ndarray
    prompts: tuple
    prompt_weights: np.ndarray
    max_len: int
    reward: Reward
    baseline: object = 0.0
    sampler: Sampler | None = None
    name: str = "task"
    spec: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        m = self.model
        V = m.vocab_size
        self.theta = check_theta(self.theta, m.num_params)
        if isinstance(self.max_len, bool) or not isinstance(self.max_len, (int, np.integer)):
            raise ValueError(f"max_len must be an integer >= 1, got {self.max_len!r}")
        if self.max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {self.max_len}")
        self.max_len = int(self.max_len)
        if len(self.prompts) == 0:
            raise ValueError("a task needs at least one prompt (the empty prompt [] is allowed)")
        prompts = []
        for i, pr in enumerate(self.prompts):
            if not isinstance(pr, (list, tuple)):
                raise ValueError(f"prompt {i} must be a list of token ids, got {pr!r}")
            for t in pr:
                if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
                    raise ValueError(f"prompt {i} holds a non-integer token {t!r}")
                if not 0 <= t < V:
                    raise ValueError(
                        f"prompt {i} holds token id {t}, out of range 0..{V - 1} "
                        f"(V={V}; id {V} is BOS and is never a prompt token)")
            prompts.append(tuple(int(t) for t in pr))
        self.prompts = tuple(prompts)
        check_lengths = getattr(m, "check_lengths", None)  # models with a position limit
        if callable(check_lengths):
            check_lengths(max(len(p) for p in prompts), self.max_len)
        w = np.asarray(self.prompt_weights, dtype=float)
        if w.shape != (len(prompts),):
            raise ValueError(
                f"prompt_weights has {w.size} entries for {len(prompts)} prompts")
        if not np.all(np.isfinite(w)):
            raise ValueError(f"prompt_weights must be finite, got {w.tolist()}")
        if np.any(w < 0):
            raise ValueError(f"prompt_weights must be non-negative, got {w.tolist()}")
        if abs(w.sum() - 1.0) > WEIGHT_SUM_TOL:
            raise ValueError(f"prompt_weights must sum to 1, they sum to {w.sum():.12g}")
        self.prompt_weights = w
        self.reward = make_reward(self.reward, eos=self.model.eos)  # a callable is wrapped
        self.reward.check_vocabulary(V, self.model.eos)
        if isinstance(self.baseline, str):
            if self.baseline != "mean":
                raise ValueError(f"baseline must be a number or 'mean', got {self.baseline!r}")
        else:
            b = float(self.baseline)
            if not math.isfinite(b):
                raise ValueError(f"baseline must be finite, got {self.baseline!r}")
            self.baseline = b
        if self.sampler is not None and not isinstance(self.sampler, Sampler):
            raise TypeError("sampler must be a fisher_ref.samplers.Sampler or None")

    @property
    def eos(self):
        return bool(self.model.eos)

    @property
    def on_policy(self):
        return self.sampler is None

    def to_json(self):
        """The task-file dict of DESIGN §5 (weights written out)."""
        d = {"model": self.model.describe(), "prompts": [list(p) for p in self.prompts],
             "prompt_weights": self.prompt_weights.tolist(), "max_len": self.max_len,
             "reward": self.reward.to_json(), "baseline": self.baseline,
             "sampler": None if self.sampler is None else self.sampler.to_json()}
        return d

    def with_(self, **changes):
        """A copy with some fields replaced (validated again)."""
        kw = {f: getattr(self, f) for f in ("model", "theta", "prompts", "prompt_weights",
                                             "max_len", "reward", "baseline", "sampler",
                                             "name", "spec")}
        kw.update(changes)
        return Task(**kw)


def task_from_json(data, name="task"):
    """Build a :class:`Task` from a task-file dict (DESIGN §5), validating every field."""
    if not isinstance(data, dict):
        raise ValueError(f"a task must be a JSON object, got {type(data).__name__}")
    extra = set(data) - TASK_KEYS
    if extra:
        raise ValueError(f"unknown task keys {sorted(extra)}; allowed: {sorted(TASK_KEYS)}")
    for key in ("model", "prompts", "max_len"):
        if key not in data:
            raise ValueError(f"task is missing the required key {key!r}")
    model = make_model(data["model"])
    prompts = data["prompts"]
    if not isinstance(prompts, list):
        raise ValueError(f"prompts must be a list of token lists, got {prompts!r}")
    weights = data.get("prompt_weights")
    if weights is None:
        weights = [1.0 / len(prompts)] * len(prompts) if prompts else []
    theta = data.get("theta")
    theta = model.init_params() if theta is None else np.asarray(theta, dtype=float)
    reward = make_reward(data.get("reward", {"name": "count", "token": 1}), eos=model.eos)
    return Task(model=model, theta=theta, prompts=prompts, prompt_weights=weights,
                max_len=data["max_len"], reward=reward, baseline=data.get("baseline", 0.0),
                sampler=make_sampler(data.get("sampler")),
                name=data.get("name", name), spec=dict(data))


def load_task(path):
    """Load a task file (JSON, DESIGN §5)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"task file not found: {path}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"task file {path} is not valid JSON: {exc}") from None
    return task_from_json(data, name=path.stem)


def _config_dir():
    return resources.files("fisher_ref") / "configs"


def list_configs():
    """Names of the configs shipped with the package."""
    return sorted(p.name[:-5] for p in _config_dir().iterdir() if p.name.endswith(".json"))


def load_config(name):
    """Load a named config shipped with the package (see :func:`list_configs`)."""
    names = list_configs()
    if name not in names:
        raise ValueError(f"unknown config {name!r}; shipped configs: {', '.join(names)}")
    data = json.loads((_config_dir() / f"{name}.json").read_text())
    return task_from_json(data, name=name)
