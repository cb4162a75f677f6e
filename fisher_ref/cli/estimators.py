"""``python -m fisher_ref estimators``: every preset loss on one task, one row each.

Each row is the exact expected gradient of the preset's loss over groups of
``--group-size`` responses (:func:`fisher_ref.estimators.expected_loss_gradient`), held
to its target (the policy gradient; the sequence KL gradient for the KL terms): the
fitted ``scale`` (-1 unbiased), the ``cosine``, the ``relative_bias`` after the scale,
the variance of one batch's gradient (trace) and the MSE of an average over ``--batch``
batches. A batch is one group, or ``--groups-per-batch K`` groups (the loss normalises
over all of them, as a trainer's mini-batch), padded as ``--pad`` says. ``--symmetric``
enumerates each group once as a multiset (every preset's loss is symmetric in its
responses); past ``--max-groups`` groups the run is refused at once, naming both.
"""
from __future__ import annotations

import inspect

import numpy as np

from fisher_ref.cli._common import count_arg, task_from_args
from fisher_ref.engine.plan import EnumerationTooLarge
from fisher_ref.estimators.groups import DEFAULT_MAX_GROUPS, check_groups
from fisher_ref.limits import readable

__all__ = ["add_arguments", "run", "report_rows", "check_cli_groups"]


def add_arguments(parser):
    """``--batch B``, ``--group-size G``, ``--groups-per-batch K``, ``--pad``, ``--preset
    NAME``, ``--max-groups N`` and ``--symmetric``."""
    parser.add_argument("--batch", type=count_arg, default=16,
                        help="groups averaged by the MSE column (default 16)")
    parser.add_argument("--group-size", type=count_arg, default=2,
                        help="responses per group G (default 2); presets that need more "
                             "are left out")
    parser.add_argument("--groups-per-batch", type=count_arg, default=1,
                        help="groups per batch K, sharing the loss's normalisers (default 1)")
    parser.add_argument("--pad", choices=("max_len", "longest"), default="max_len",
                        help="pad each batch to max_len (default) or to its longest response")
    parser.add_argument("--preset", action="append", default=None,
                        help="a preset to report (repeatable, each reported once; default: "
                             "every preset)")
    parser.add_argument("--max-groups", type=count_arg, default=None,
                        help=f"refuse past this many groups (default "
                             f"{readable(DEFAULT_MAX_GROUPS)})")
    parser.add_argument("--symmetric", action="store_true",
                        help="enumerate each group as a multiset, once for all its orders "
                             "(far fewer groups; every preset's loss is symmetric in its "
                             "responses, and one that is not is refused)")


def _check(args):
    if args.batch < 1:
        raise ValueError(f"--batch must be at least 1, got {args.batch}")
    if args.group_size < 1:
        raise ValueError(f"--group-size must be at least 1, got {args.group_size}")
    if args.groups_per_batch < 1:
        raise ValueError(f"--groups-per-batch must be at least 1, got {args.groups_per_batch}")
    if args.max_groups is not None and args.max_groups < 1:
        raise ValueError(f"--max-groups must be at least 1, got {args.max_groups}")


def _cosine(a, b):
    d = np.linalg.norm(a) * np.linalg.norm(b)
    return float(a @ b / d) if d > 0 else 0.0


def _presets(names):
    """The preset names in the order given, each once (``--preset`` repeated)."""
    return None if names is None else list(dict.fromkeys(names))


def check_cli_groups(task, group_size, symmetric, max_groups):
    """Refuse (:class:`~fisher_ref.engine.plan.EnumerationTooLarge`) a run past
    ``max_groups`` groups with advice in the command line's own terms: ``--group-size``,
    ``--symmetric`` and ``--max-groups``."""
    limit = DEFAULT_MAX_GROUPS if max_groups is None else max_groups
    try:
        check_groups(task, group_size, symmetric, limit)
    except EnumerationTooLarge as exc:
        head = str(exc).split(". Use ")[0]
        advice = "use a smaller --group-size or task" + \
            ("" if symmetric else ", --symmetric (each group as a multiset: every preset's "
                                  "loss is symmetric in its responses)") + \
            f", or raise --max-groups (now {readable(limit)})"
        raise EnumerationTooLarge(f"{head.replace('expected_loss_gradient', 'estimators')}: "
                                  f"{advice}") from None


def report_rows(task, group_size=2, batch=16, names=None, max_groups=None,
                groups_per_batch=1, pad="max_len", symmetric=False):
    """``(name, target, scale, cosine, relative_bias, variance_trace, mse)`` per preset
    (each of ``names`` once, in their order); ``symmetric``: groups as multisets."""
    from fisher_ref.engine.plan import EngineOptions
    from fisher_ref.estimators.gradient import expected_loss_gradient
    from fisher_ref.estimators.gradient import fit_scale
    from fisher_ref.estimators.presets import PRESETS, preset

    names = list(PRESETS) if names is None else _presets(names)
    for n in names:
        preset(n)  # an unknown name is refused before any work
    from fisher_ref.parallel.run import exact
    r = exact(task, progress=False,
              options=EngineOptions(keep_states=False, keep_sequences=False))
    baseline = r.baseline
    has_ref = getattr(task, "reference", None) is not None
    kw = {} if max_groups is None else {"max_groups": max_groups}
    rows = []
    for n in names:
        factory, needs_ref, g_min = PRESETS[n]
        if (needs_ref and not has_ref) or group_size < g_min:
            continue
        args = {"baseline": baseline} if "baseline" in inspect.signature(factory).parameters \
            else {}
        lg = expected_loss_gradient(task, preset(n, **args), group_size,
                                    symmetric=symmetric, policy_gradient=r.gradient,
                                    groups_per_batch=groups_per_batch, pad=pad, **kw)
        target = lg.kl_gradient if needs_ref else lg.policy_gradient
        alpha, rel = fit_scale(lg.mean, target)
        bias = lg.mean - alpha * target
        mse = float(bias @ bias + lg.variance_trace / batch)
        rows.append((n, "kl" if needs_ref else "grad", alpha, _cosine(lg.mean, target), rel,
                     lg.variance_trace, mse))
    return rows


def run(args):
    """Print one row per preset; exit 0."""
    _check(args)
    task = task_from_args(args)
    check_cli_groups(task, args.group_size, args.symmetric, args.max_groups)
    rows = report_rows(task, args.group_size, args.batch, args.preset, args.max_groups,
                       args.groups_per_batch, args.pad, args.symmetric)
    ref = getattr(task, "reference", None)
    print(f"task {task.name}: group size {args.group_size}, groups per batch "
          f"{args.groups_per_batch}, pad {args.pad}, batch {args.batch}, sampler="
          f"{'none' if task.sampler is None else task.sampler.to_json()}, reference="
          f"{'none' if ref is None else ref.to_json()}")
    print(f"{'preset':16s} {'target':>6s} {'scale':>11s} {'cosine':>9s} {'rel.bias':>9s} "
          f"{'var(trace)':>11s} {'MSE@' + str(args.batch):>11s}")
    for name, target, scale, cos, rel, var, mse in rows:
        print(f"{name:16s} {target:>6s} {scale:+11.5f} {cos:+9.5f} {rel:9.2e} {var:11.4g} "
              f"{mse:11.4g}")
    return 0
