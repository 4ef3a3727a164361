"""What tests/test_launcher.py forks from the warm worker server in place of pipeline.worker: it
reports how it was set up (a DeepSpeed rank to `<report>.<rank>`), then ends as its argument says."""

import json
import os
import signal
import subprocess
import sys
import time


def main(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("--local_rank")]  # as pipeline.worker drops it
    report, how = args[0], args[1] if len(args) > 1 else "exit"
    preloaded = "torch" in sys.modules  # before this module imports anything heavy
    import torch

    rank = os.environ.get("RANK")
    with open(report if rank is None else f"{report}.{rank}", "w") as f:
        json.dump({"pid": os.getpid(), "sid": os.getsid(0), "env": dict(os.environ), "cwd": os.getcwd(),
                   "threads": torch.get_num_threads(), "preloaded": preloaded, "argv": sys.argv}, f)
    print("hello from the warm worker", flush=True)
    if how == "signal":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "sleep":  # a grandchild in its group, as a worker's own children are
        subprocess.Popen(["sleep", "300"])
        time.sleep(300)
    if how == "raise":
        raise ValueError("a worker that fails")
    if how == "threads_first":  # as transformers loads weights: the fork's first torch work is in 4 new threads
        from concurrent.futures import ThreadPoolExecutor

        tensors = [torch.ones(64 * 1024, dtype=torch.bfloat16) for _ in range(16)]
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(lambda t: t.to(torch.float32), tensors))
        return 0
    if how == "rank_1_fails":  # its sibling waits, as a rank waits in a collective for a dead one
        if rank == "1":
            return 5
        time.sleep(300)
    return 3
