"""How often a forked child loses torch's thread pool, with and without the warm workers' mend.

A warm DeepSpeed rank is forked twice (server -> leader -> rank); its first torch work runs in 4 new
threads at once, as transformers loads weights. torch replaces its pthreadpool after a fork without a
lock, so one of those threads can find no pool (`RuntimeError: ... Invalid thread pool!`). The mend,
pipeline.launch.warm._apply_thread_budget, sets the thread count in the child's main thread first.

    .venv/bin/python benchmarks/fork_thread_pool.py [--forks 150]
"""

import argparse
import os
from concurrent.futures import ThreadPoolExecutor

import torch

from pipeline.launch.warm import _apply_thread_budget


def failures(forks: int, mend: bool) -> int:
    tensors = [torch.ones(64 * 1024, dtype=torch.bfloat16) for _ in range(16)]
    failed = 0
    for _ in range(forks):
        leader = os.fork()
        if leader == 0:
            _apply_thread_budget()  # as the warm server's forked worker does
            rank = os.fork()
            if rank == 0:
                if mend:
                    _apply_thread_budget()
                try:
                    with ThreadPoolExecutor(max_workers=4) as pool:
                        list(pool.map(lambda t: t.to(torch.float32), tensors))
                    os._exit(0)
                except RuntimeError:
                    os._exit(1)
            os._exit(os.waitstatus_to_exitcode(os.waitpid(rank, 0)[1]))
        failed += os.waitstatus_to_exitcode(os.waitpid(leader, 0)[1]) != 0
    return failed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--forks", type=int, default=150)
    forks = ap.parse_args().forks
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    torch.ones(10).sum()
    print(f"torch {torch.__version__}, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}")
    for mend in (False, True):
        print(f"{'with' if mend else 'without'} the mend: {failures(forks, mend)} of {forks} forked ranks failed")


if __name__ == "__main__":
    main()
