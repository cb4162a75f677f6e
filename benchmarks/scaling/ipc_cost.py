"""What it costs a worker process to send an array back: through the result pipe of a
``ProcessPoolExecutor`` (spawned, as ``exact(workers=N)`` starts them) against one copy
through shared memory, for arrays of 0.1 to 24 MiB (best of 5 each).

    python benchmarks/scaling/ipc_cost.py

``fisher_ref.parallel.worker_memory.SHARED_BYTES`` sends a worker's large arrays through shared
memory because of what this prints.
"""
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import shared_memory

import numpy as np


def _array(n):
    return np.ones(n)


def _shared(n):
    mem = shared_memory.SharedMemory(create=True, size=8 * n)
    np.ndarray((n,), buffer=mem.buf)[...] = 1.0
    name = mem.name
    mem.close()
    return name


def _read(name, n):
    mem = shared_memory.SharedMemory(name=name)
    out = np.ndarray((n,), buffer=mem.buf).copy()
    mem.close()
    mem.unlink()
    return out


def main():
    ex = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    ex.submit(_array, 10).result()
    print("| MiB | through the pipe | through shared memory |")
    print("|---|---|---|")
    for mib in (0.1, 4, 12, 24):
        n = int(mib * 2 ** 20 / 8)
        pipe, shm = [], []
        for _ in range(5):
            t = time.perf_counter()
            ex.submit(_array, n).result()
            pipe.append(time.perf_counter() - t)
            t = time.perf_counter()
            _read(ex.submit(_shared, n).result(), n)
            shm.append(time.perf_counter() - t)
        print(f"| {mib} | {min(pipe) * 1e3:.1f} ms | {min(shm) * 1e3:.1f} ms |")
    ex.shutdown()


if __name__ == "__main__":
    import argparse
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    main()
