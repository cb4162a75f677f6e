"""The shards of one exact run as Ray tasks, on one machine or a cluster.

:func:`exact_ray` runs ``exact_shard(task, (i, n))`` (:mod:`fisher_ref.parallel.run`)
as one Ray task per shard and merges their sums once, in the calling process: the
same :class:`fisher_ref.ExactResult` as ``exact(task)``, to rounding. What
crosses the network: the task (put once in Ray's object store, a task file's worth of
data: the model's description, its parameters, prompts, reward) and each shard's sums
(a ``ShardResult``: a few ``(P,)`` and ``(T, T, P)`` arrays
per stream, plus the shard's rows of the per-state and per-response arrays when those
are kept).

A shard whose task raises or whose worker dies is run again, up to ``max_retries``
times; a shard that fails for good ends the run with :class:`ShardFailed`, which names
it. The shards that did finish are not summed into a result: a partial sum is never
returned as a whole one.

Joining a cluster by address is bounded in time: before Ray is asked to connect (which
retries for minutes where nothing answers), the address must accept a connection and
answer as a gRPC server (Ray's GCS and its client server both are) within
``connect_timeout`` seconds (:data:`CONNECT_TIMEOUT`); else :class:`ConnectionError`, naming
the address.

Needs the optional extra ``distributed`` (``pip install "fisher-ref[distributed]"``:
``ray[client]>=2``, the client for ``ray://`` addresses included); ``fisher_ref`` must be
importable on every node of the cluster.
"""
from __future__ import annotations

import math
import os
import socket
import time
from dataclasses import replace

from fisher_ref.engine.plan import DEFAULT_MAX_BYTES, DEFAULT_MAX_SECONDS, EngineOptions, check_cost
from fisher_ref.engine.run import plan
from fisher_ref.parallel.shards import merge, plan_shards

__all__ = ["CONNECT_TIMEOUT", "check_address", "exact_ray", "ShardFailed", "run_shard"]

#: Seconds :func:`exact_ray` waits by default for the cluster at ``address`` to answer.
CONNECT_TIMEOUT = 30.0


class ShardFailed(RuntimeError):
    """A shard of :func:`exact_ray` failed on every attempt; ``shard`` is its ``(i, n)``."""

    def __init__(self, message, shard):
        super().__init__(message)
        self.shard = shard


def run_shard(task, shard, options):
    """What one Ray task runs: :func:`fisher_ref.parallel.exact_shard` of ``shard`` with
    ``options`` (an :class:`fisher_ref.engine.plan.EngineOptions`)."""
    from fisher_ref.parallel.run import exact_shard
    return exact_shard(task, shard, options=options)


def _ray():
    try:
        import ray
    except ImportError as e:  # pragma: no cover - CI installs the extra
        raise ImportError("fisher_ref.parallel.distributed needs Ray: pip install "
                          "'fisher-ref[distributed]' (or pip install 'ray[client]>=2')") from e
    return ray


def exact_ray(task, address=None, shards=None, *, max_retries=2, runner=None, topk=(),
              chunk=None, keep_states=False, keep_sequences=False,
              max_seconds=DEFAULT_MAX_SECONDS, max_bytes=DEFAULT_MAX_BYTES,
              quantities="all", connect_timeout=CONNECT_TIMEOUT):
    """``exact(task, ...)`` with its shards run as Ray tasks, merged here.

    Args:
        task: a :class:`fisher_ref.Task`.
        address: the Ray cluster to join (``"ray://host:10001"``, ``"host:6379"``,
            ``"auto"``); ``None`` joins the Ray this process already runs, else starts a
            local one (or joins the one ``RAY_ADDRESS`` names, as ``ray.init`` does).
            A ``host:port`` address (``ray://`` or not, given or in ``RAY_ADDRESS``) must
            answer within ``connect_timeout``.
        shards: how many shards (one Ray task each); default: the cluster's CPUs. Never
            more than the task has subtrees at the cut (``plan_shards``).
        max_retries: extra attempts of a shard that raised or whose worker died.
        runner: ``(task, shard, options) -> ShardResult`` run in each Ray task, ``options``
            an :class:`fisher_ref.engine.plan.EngineOptions` (default :func:`run_shard`, the
            numpy engine); it must be picklable.
        topk, chunk, keep_states, keep_sequences, max_seconds, max_bytes, quantities: as
            for :func:`fisher_ref.exact` and its options. The per-state and per-response
            arrays are not
            kept unless asked (they would cross the network); the limits apply to the
            whole run, its time shared by the shards and its memory by each.
        connect_timeout: seconds (default :data:`CONNECT_TIMEOUT`, 30) that a
            ``host:port`` address has to accept a connection and answer as a gRPC server,
            checked before Ray connects: an address where nothing answers fails within
            about this time, instead of Ray's minutes of retries.

    Raises:
        ShardFailed: a shard failed on every attempt (the message names it and the
            last error).
        ConnectionError: nothing at ``address`` answered within ``connect_timeout`` (the
            message names the address).
        fisher_ref.EnumerationTooLarge, ValueError: as :func:`fisher_ref.exact`; also
            ``address`` not a string or ``None``, ``connect_timeout`` not a positive number.
    """
    if address is not None and not isinstance(address, str):
        raise ValueError(f"exact_ray: address must be a string ('host:port', "
                         f"'ray://host:port', 'auto') or None, got {address!r}")
    if isinstance(connect_timeout, bool) or not isinstance(connect_timeout, (int, float)) \
            or not 0 < connect_timeout < math.inf:
        raise ValueError(f"exact_ray: connect_timeout must be a positive number of seconds, "
                         f"got {connect_timeout!r}")
    ray = _ray()
    if not isinstance(max_retries, int) or isinstance(max_retries, bool) or max_retries < 0:
        raise ValueError(f"max_retries must be a non-negative integer, got {max_retries!r}")
    if shards is not None and (isinstance(shards, bool) or not isinstance(shards, int)
                               or shards < 1):
        raise ValueError(f"shards must be a positive integer or None, got {shards!r}")
    options = EngineOptions(topk=topk, chunk=chunk, keep_states=keep_states,
                            keep_sequences=keep_sequences, quantities=quantities,
                            progress=False).unlimited()  # checked here, for the whole run
    one = plan(task, options)[1]
    if address is not None or not ray.is_initialized():
        check_address(address if address is not None else os.environ.get("RAY_ADDRESS"),
                      connect_timeout)
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False)
    n = shards or max(1, int(ray.cluster_resources().get("CPU", 1)))
    n = max(1, min(n, plan_shards(task, n).bounds[-1]))
    # the limits: the time of n shards side by side, the memory of one worker
    seconds = plan(task, options, workers=n)[1].seconds
    check_cost(replace(one, seconds=seconds, workers=n), max_seconds, max_bytes)
    remote = ray.remote(num_cpus=1, max_retries=max_retries, retry_exceptions=True)(
        runner or run_shard)
    task_ref = ray.put(task)
    refs = [remote.remote(task_ref, (i, n), options) for i in range(n)]
    parts = []
    for i, ref in enumerate(refs):
        try:
            parts.append(ray.get(ref))
        except ray.exceptions.RayError as e:
            for other in refs[i + 1:]:
                ray.cancel(other, force=True)
            raise ShardFailed(f"shard {i} of {n} failed after {max_retries + 1} attempt(s); "
                              f"no result is returned for a partial run. Last error: "
                              f"{type(e).__name__}: {str(e).strip()[-600:]}", (i, n)) from e
    return merge(task, parts)


def check_address(address, timeout=CONNECT_TIMEOUT):
    """Raise :class:`ConnectionError`, naming ``address``, unless the ``host:port`` it names
    (after ``ray://``) accepts a TCP connection and answers the HTTP/2 connection preface
    with a SETTINGS frame, as a gRPC server does (Ray's GCS and its client server), within
    ``timeout`` seconds in all. Nothing is checked for ``None`` or a name Ray resolves
    itself (``"auto"``, ``"local"``)."""
    if not address:
        return
    target = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        return
    end = time.monotonic() + timeout
    try:
        conn = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    except OSError as e:
        raise ConnectionError(f"exact_ray: nothing accepts a connection at address "
                              f"{address!r} ({type(e).__name__}: {e}); start the cluster or "
                              "check the address") from e
    head = b""
    try:
        with conn:
            conn.settimeout(max(end - time.monotonic(), 0.01))
            conn.sendall(_HTTP2_PREFACE)
            while len(head) < 9:  # a frame header: length (3 bytes), type, flags, stream id
                chunk = conn.recv(9 - len(head))
                if not chunk:
                    break
                head += chunk
    except OSError as e:  # the time ran out (socket.timeout), or the server hung up
        head = head or f"{type(e).__name__}: {e}".encode()
    if len(head) < 9 or head[3] != _SETTINGS:
        raise ConnectionError(f"exact_ray: the server at address {address!r} accepts "
                              f"connections but did not answer as a Ray cluster (a gRPC "
                              f"server) within connect_timeout={timeout} s ({head[:60]!r})")


#: What an HTTP/2 client sends first: the connection preface, then an empty SETTINGS frame.
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_SETTINGS = 4  # the frame type a server's first frame has
