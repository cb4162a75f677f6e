"""Tasks: a model with parameters, weighted prompts, a length, a reward, a
baseline and an optional sampler — everything the engines enumerate or sample.

Tasks load from plain JSON (the "Task files" section of the README)::

    {"model": {"vocab_size": 5, "context": 2, "embed_dim": 3, "hidden": 8,
               "eos": true, "init_seed": 0, "init_scale": 1.0},
     "prompts": [[1, 2], [3]], "prompt_weights": [0.5, 0.5], "max_len": 3,
     "reward": {"name": "count", "token": 2}, "baseline": 0.0,
     "sampler": {"kind": "temperature", "temperature": 1.5}}

``prompt_weights`` defaults to uniform, ``baseline`` to 0 (a number, or
``"mean"`` for the exact mean reward), ``reward`` to the count of token 1,
``sampler`` to none; an optional ``theta`` list fixes the parameters. An optional
``reference`` (the kinds of ``sampler``) is the reference policy of KL penalties
(:mod:`fisher_ref.estimators`); an optional ``old_policy`` (the kinds of ``sampler``, or
the string ``"sampler"``: the responses were drawn by :math:`\theta_{old}`) is the
:math:`\theta_{old}` of PPO-style ratios at a step past the first.

Every field is validated when the task is built; a bad one raises
``ValueError`` (``TypeError`` for an object of the wrong kind) naming it. The
limits on sizes and magnitudes are those of :mod:`fisher_ref.limits`.
"""
from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from fisher_ref.models import make_model
from fisher_ref.fileio import read_text, strict_json
from fisher_ref.limits import (MAX_ABS_VALUE, MAX_INIT_SCALE, MAX_PROMPT_LEN,
                               MAX_SEED, MAX_TASK_FILE_BYTES, is_real, readable)
from fisher_ref.models.base import check_theta
from fisher_ref.rewards import Reward, make_reward
from fisher_ref.samplers import Sampler, make_sampler

__all__ = ["Task", "task_from_json", "load_task", "load_config", "list_configs",
           "require_task", "WEIGHT_SUM_TOL"]

TASK_KEYS = {"model", "prompts", "prompt_weights", "max_len", "reward", "baseline",
             "sampler", "reference", "old_policy", "theta", "name", "description"}
#: Prompt weights must sum to 1 within this; they are then divided by their sum, so
#: that the total probability is 1 to rounding (what ``verify`` checks at 1e-10).
WEIGHT_SUM_TOL = 1e-9
# What the engines use of a model.
_MODEL_ATTRS = ("logits", "windows", "vocab_size", "num_params", "eos", "bos", "context")


def _check_model(m):
    missing = [a for a in _MODEL_ATTRS if not hasattr(m, a)]
    if missing:
        raise TypeError(f"Task.model must be a model (an object with {', '.join(_MODEL_ATTRS)}; "
                        f"see fisher_ref.models.base), got {type(m).__name__} {m!r:.60} "
                        f"(missing {', '.join(missing)})")


def _check_prompts(prompts, V, model=None):
    """Prompts as tuples of ints, each id in ``0..V-1``, or as the model's own
    ``check_prompt_ids(prompts)`` allows (a torch module's input-only ids ``>= V``)."""
    if not isinstance(prompts, (list, tuple)):
        raise ValueError(f"prompts must be a list of token lists, got {prompts!r:.80}")
    if len(prompts) == 0:
        raise ValueError("a task needs at least one prompt (the empty prompt [] is allowed)")
    out = []
    for i, pr in enumerate(prompts):
        if not isinstance(pr, (list, tuple)):
            raise ValueError(f"prompt {i} must be a list of token ids, got {pr!r:.80}")
        if len(pr) > MAX_PROMPT_LEN:
            raise ValueError(f"prompt {i} has {len(pr):,} tokens, more than the limit "
                             f"{MAX_PROMPT_LEN:,} (fisher_ref.limits.MAX_PROMPT_LEN: no model "
                             "reads more, and every state stores its prompt)")
        for t in pr:
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
                raise ValueError(f"prompt {i} holds a non-integer token {t!r}")
        out.append(tuple(int(t) for t in pr))
    own = getattr(model, "check_prompt_ids", None)
    if callable(own):
        own(out)
        return tuple(out)
    bos = getattr(model, "bos", V)
    for i, pr in enumerate(out):
        for t in pr:
            if not 0 <= t < V:
                raise ValueError(
                    f"prompt {i} holds token id {t}, out of range 0..{V - 1} (V={V}; prompts "
                    f"hold vocabulary ids only{f', and id {bos} is BOS' if bos >= V else ''})")
    return tuple(out)


def _check_weights(weights, n):
    r"""Prompt weights as float64 ``(n,)``: numbers, finite, non-negative, summing to 1
    within ``WEIGHT_SUM_TOL``; divided by their sum when it is off by more than rounding."""
    want = f"a flat list of numbers, one per prompt ({n} prompt{'s' * (n != 1)})"
    if isinstance(weights, (str, bytes, dict)) or weights is None or np.ndim(weights) == 0:
        raise ValueError(f"prompt_weights must be {want}, got the "
                         f"{type(weights).__name__} {weights!r:.80}")
    _check_numbers(weights, "prompt_weights")
    try:
        w = np.asarray(weights)
    except ValueError as exc:
        raise ValueError(f"prompt_weights must be {want}: {exc}") from None
    if w.ndim != 1:
        raise ValueError(f"prompt_weights must be {want}, got a nested list of shape "
                         f"{w.shape}: {w.tolist()!r:.80}")
    if w.shape != (n,):
        raise ValueError(f"prompt_weights has {w.size} entries for {n} prompts; it must be "
                         f"{want}")
    if w.dtype.kind not in "iuf":
        raise ValueError(f"prompt_weights must be numbers, got {w.tolist()!r:.80}")
    w = w.astype(float)
    if not np.all(np.isfinite(w)):
        raise ValueError(f"prompt_weights must be finite, got {w.tolist()}")
    if np.any(w < 0):
        raise ValueError(f"prompt_weights must be non-negative, got {w.tolist()}")
    total = w.sum()
    if abs(total - 1.0) > WEIGHT_SUM_TOL:
        raise ValueError(f"prompt_weights must sum to 1, they sum to {total:.12g}")
    if abs(total - 1.0) > n * np.finfo(float).eps:  # off by more than rounding
        w = w / total
    return w


def _check_numbers(values, name):
    """Refuse ``true``/``false`` (and strings) in a flat list meant to hold numbers:
    numpy would read them as 1.0 and 0.0."""
    if isinstance(values, (list, tuple)):
        for i, v in enumerate(values):
            if isinstance(v, (bool, np.bool_)):
                raise ValueError(f"{name} must be numbers, but entry {i} is "
                                 f"{str(bool(v)).lower()} (a JSON boolean, not 1 or 0)")


def _check_name(name, where="name"):
    """A task name: a string that UTF-8 can encode and a terminal can print."""
    if not isinstance(name, str):
        raise ValueError(f"{where} must be a string, got {name!r}")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{where} {name!r} cannot be written as UTF-8 ({exc.reason} at "
                         f"character {exc.start}); golden files and --json store it") from None
    bad = [c for c in name if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")]
    if bad:
        raise ValueError(f"{where} {name!r} holds control characters {bad!r:.40}, which a "
                         "terminal would act on instead of printing")
    return name


def _check_baseline(b):
    if isinstance(b, str):
        if b != "mean":
            raise ValueError(f"baseline must be a number or 'mean', got {b!r}")
        return b
    if not is_real(b):
        raise ValueError(f"baseline must be a number or 'mean', got {b!r}")
    if isinstance(b, (float, np.floating)) and not math.isfinite(b):
        raise ValueError(f"baseline must be finite, got {b!r}")
    if abs(b) > MAX_ABS_VALUE:
        raise ValueError(f"baseline must be at most {MAX_ABS_VALUE:.0e} in size, got "
                         f"{readable(b)}: A^2 h^2 would overflow float64")
    return float(b)


@dataclass
class Task:
    """A fully specified enumeration/sampling task.

    Attributes:
        model: a model object (``logits(theta, windows)``, ``windows``, ``vocab_size``,
            ``context``, ``eos``, ``bos``, ``num_params``).
        theta: float64 ``(P,)`` policy parameters.
        prompts: tuple of token tuples (the empty prompt allowed).
        prompt_weights: float64 ``(n_prompts,)``, non-negative, summing to 1 (weights
            within ``WEIGHT_SUM_TOL`` of 1 are divided by their sum).
        max_len: longest response ``T``.
        reward: ``R(prompt, response) -> float``.
        baseline: a constant (at most 1e100 in size), or ``"mean"`` for the exact
            mean reward.
        sampler: ``mu`` for off-policy sampling, or ``None`` (on-policy).
        reference: a reference policy :math:`p_{ref}` (the kinds of ``sampler``; a
            perturbed copy of ``theta`` is the usual one), or ``None``; only the KL
            terms of :mod:`fisher_ref.estimators` read it.
        old_policy: :math:`\theta_{old}` of the ratios :math:`p_\theta/p_{\theta_{old}}`
            (the kinds of ``sampler``), the string ``"sampler"`` (:math:`\theta_{old}` is the
            sampler, or the policy when there is none), or ``None`` (the first step,
            :math:`\theta_{old} = \theta`); only :mod:`fisher_ref.estimators` reads it.

    Raises:
        ValueError: a field with a bad value, naming it.
        TypeError: ``model`` or ``sampler`` is not a model or sampler object, or
            ``theta`` holds something other than numbers.
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
    reference: Sampler | None = None
    old_policy: Sampler | str | None = None

    def __post_init__(self):
        _check_model(self.model)
        m = self.model
        V = m.vocab_size
        self.theta = check_theta(self.theta, m.num_params)
        if isinstance(self.max_len, bool) or not isinstance(self.max_len, (int, np.integer)):
            raise ValueError(f"max_len must be an integer >= 1, got {self.max_len!r}")
        if self.max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {self.max_len}")
        self.max_len = int(self.max_len)
        self.prompts = _check_prompts(self.prompts, V, m)
        check_lengths = getattr(m, "check_lengths", None)  # models with a position limit
        if callable(check_lengths):
            check_lengths(max(len(p) for p in self.prompts), self.max_len)
        self.prompt_weights = _check_weights(self.prompt_weights, len(self.prompts))
        self.reward = make_reward(self.reward, eos=self.model.eos)  # a callable is wrapped
        self.reward.check_vocabulary(V, self.model.eos)
        self.reward.check_length(self.max_len, self.model.eos)
        self.baseline = _check_baseline(self.baseline)
        if self.sampler is not None and not isinstance(self.sampler, Sampler):
            raise TypeError("sampler must be a fisher_ref.samplers.Sampler or None")
        if self.reference is not None and not isinstance(self.reference, Sampler):
            raise TypeError("reference must be a fisher_ref.samplers.Sampler or None")
        if not (self.old_policy is None or isinstance(self.old_policy, Sampler)
                or (isinstance(self.old_policy, str) and self.old_policy == "sampler")):
            raise TypeError(f"old_policy must be a fisher_ref.samplers.Sampler, the string "
                            f"'sampler' or None, got {self.old_policy!r:.60}")
        _check_name(self.name)

    @property
    def eos(self):
        return bool(self.model.eos)

    @property
    def on_policy(self):
        return self.sampler is None

    def to_json(self):
        """The task-file dict (weights written out)."""
        d = {"model": self.model.describe(), "prompts": [list(p) for p in self.prompts],
             "prompt_weights": self.prompt_weights.tolist(), "max_len": self.max_len,
             "reward": self.reward.to_json(), "baseline": self.baseline,
             "sampler": None if self.sampler is None else self.sampler.to_json()}
        if self.reference is not None:
            d["reference"] = self.reference.to_json()
        if self.old_policy is not None:
            d["old_policy"] = (self.old_policy if isinstance(self.old_policy, str)
                               else self.old_policy.to_json())
        return d

    def with_(self, **changes):
        """A copy with some fields replaced (validated again)."""
        kw = {f: getattr(self, f) for f in ("model", "theta", "prompts", "prompt_weights",
                                             "max_len", "reward", "baseline", "sampler",
                                             "name", "spec", "reference", "old_policy")}
        kw.update(changes)
        return Task(**kw)


def require_task(task, who="task"):
    """Raise ``TypeError`` naming ``who`` unless ``task`` is a :class:`Task`."""
    if not isinstance(task, Task):
        hint = (f" (load a named config with load_config({task!r}))"
                if isinstance(task, str) else "")
        raise TypeError(f"{who} must be a fisher_ref Task (from load_config, load_task, "
                        f"task_from_json or Task(...)), got {type(task).__name__}{hint}")
    return task


def _model_spec(spec):
    """A task file's ``model`` with what the model builder would take silently refused.

    ``bos`` is checked and dropped: BOS is always id ``vocab_size`` (``describe()``
    writes the key, so it may be present, but only with that value; any other would be
    ignored). ``init_seed`` must be a seed like any other (at most 2^63 - 1), and an
    integer ``init_scale`` too large for a float is refused by name."""
    if not isinstance(spec, dict):
        return spec
    spec = dict(spec)
    if "bos" in spec:
        bos, V = spec.pop("bos"), spec.get("vocab_size")
        if isinstance(bos, bool) or bos != V or not isinstance(V, int):
            raise ValueError(f"model.bos is {bos!r:.40}, but BOS is always id vocab_size "
                             f"({V!r:.40}); leave the key out")
    seed = spec.get("init_seed")
    if isinstance(seed, int) and not isinstance(seed, bool) and seed > MAX_SEED:
        raise ValueError(f"model.init_seed must be a non-negative integer of at most 2^63 - 1 "
                         f"(as every seed), got {readable(seed)}")
    scale = spec.get("init_scale")
    if isinstance(scale, int) and not isinstance(scale, bool) and abs(scale) > MAX_INIT_SCALE:
        raise ValueError(f"model.init_scale is {readable(scale)}, more than the limit "
                         f"{readable(MAX_INIT_SCALE)}")
    return spec


def task_from_json(data, name="task"):
    """Build a :class:`Task` from a task-file dict, validating every field."""
    if not isinstance(data, dict):
        raise ValueError(f"a task must be a JSON object, got {type(data).__name__}")
    extra = set(data) - TASK_KEYS
    if extra:
        raise ValueError(f"unknown task keys {sorted(extra)}; allowed: {sorted(TASK_KEYS)}")
    for key in ("model", "prompts", "max_len"):
        if key not in data:
            raise ValueError(f"task is missing the required key {key!r}")
    model = make_model(_model_spec(data["model"]))
    prompts = data["prompts"]
    if not isinstance(prompts, list):
        raise ValueError(f"prompts must be a list of token lists, got {prompts!r:.80}")
    weights = data.get("prompt_weights")
    if weights is None:
        weights = [1.0 / len(prompts)] * len(prompts) if prompts else []
    theta = data.get("theta")
    _check_numbers(theta, "theta")
    theta = model.init_params() if theta is None else theta  # check_theta validates a list
    reward = make_reward(data.get("reward", {"name": "count", "token": 1}), eos=model.eos)
    return Task(model=model, theta=theta, prompts=prompts, prompt_weights=weights,
                max_len=data["max_len"], reward=reward, baseline=data.get("baseline", 0.0),
                sampler=make_sampler(data.get("sampler")),
                name=data.get("name", name), spec=dict(data),
                reference=_reference(data.get("reference")),
                old_policy=_old_policy(data.get("old_policy")))


def _reference(spec):
    """The task key ``"reference"``: a sampler spec (the same kinds) or ``None``."""
    try:
        return make_sampler(spec)
    except ValueError as exc:
        raise ValueError(f"reference: {exc}") from None


def _old_policy(spec):
    """The task key ``"old_policy"``: a sampler spec, the string ``"sampler"`` or ``None``."""
    if isinstance(spec, str):
        if spec != "sampler":
            raise ValueError(f"old_policy must be a sampler spec or the string 'sampler', "
                             f"got {spec!r:.60}")
        return spec
    try:
        return make_sampler(spec)
    except ValueError as exc:
        raise ValueError(f"old_policy: {exc}") from None


def load_task(path):
    """Load a task file (JSON, UTF-8; see docs/guide/tasks.md).

    Raises:
        FileNotFoundError: no such file.
        fisher_ref.fileio.FileProblem: a directory, FIFO, device or socket, an empty
            path, unreadable, larger than ``MAX_TASK_FILE_BYTES`` or not UTF-8 (a
            ``ValueError`` naming the path).
        ValueError: not valid JSON, a key twice in one object, ``NaN``, or a bad field.
    """
    text = read_text(path, "task file", MAX_TASK_FILE_BYTES)
    data = strict_json(text, f"task file {str(path)!r}")
    stem = Path(path).stem  # the default name: made printable, never refused
    stem = stem.encode("utf-8", "backslashreplace").decode("utf-8")
    return task_from_json(data, name="".join(c if c.isprintable() else "?" for c in stem))


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
    data = strict_json((_config_dir() / f"{name}.json").read_text(), f"config {name!r}")
    return task_from_json(data, name=name)
