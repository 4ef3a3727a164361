"""What tests/test_launcher.py forks from the warm worker server in place of pipeline.worker: it
reports how it was set up, then ends as its argument says."""

import json
import os
import signal
import subprocess
import sys
import time


def main(argv: list[str]) -> int:
    report, how = argv[0], argv[1] if len(argv) > 1 else "exit"
    preloaded = "torch" in sys.modules  # before this module imports anything heavy
    import torch

    with open(report, "w") as f:
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
    return 3
