"""A small process pool that scores samples with a hard per-sample timeout.

math-verify (sympy) can hang or eat memory on adversarial answers (towers of exponents, numbers
with a million digits), and its own timeouts use signal.alarm, which only works in the main thread.
So scoring runs in worker processes, each with an address-space limit; the parent hands out small
chunks, and each worker streams back one result per sample. If a sample runs past the timeout its
worker is SIGKILLed and replaced, the sample scores the timeout value, and the rest of its chunk
goes back in the queue. A batch has a budget too (`budget_s`): past it, every sample not yet
scored gets the timeout value at once, so a batch of adversarial answers costs about one timeout,
not one per worker round (`budget_cuts` counts the samples cut). A sample whose scoring raised
gets the error value (None for rewards: "cannot judge", never a silent 0.0) and is counted.
Workers that keep dying before they answer anything mean the pool cannot work at all: that
raises PoolBroken instead of scoring. Workers come from a forkserver, so a replacement costs a
fork, not an interpreter start, and the pool is safe to use from any thread.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import resource
import threading
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import wait

MEMORY_LIMIT_BYTES = 4 << 30
MAX_SILENT_DEATHS = 5  # workers in a row that died without returning a single result


class PoolBroken(RuntimeError):
    """The scoring workers cannot start or die before scoring anything."""


def _worker(conn, fn: Callable, memory_limit: int) -> None:
    try:
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    except (ValueError, OSError):
        pass
    while True:
        try:
            chunk = conn.recv()
        except EOFError:
            return
        if chunk is None:
            return
        for index, args in chunk:
            try:
                value = fn(*args)
            except MemoryError:
                value = "error"
            except Exception:  # a crash on one sample is that sample's problem only
                value = "error"
            conn.send((index, value))


class ScoringPool:
    def __init__(self, fn: Callable, workers: int | None = None, timeout_s: float = 5.0,
                 chunk_size: int = 32, memory_limit: int = MEMORY_LIMIT_BYTES, preload: tuple[str, ...] = ()):
        self.fn, self.timeout_s, self.chunk_size, self.memory_limit = fn, timeout_s, chunk_size, memory_limit
        self.size = workers or max(1, min(os.cpu_count() or 1, 8))
        self.ctx = mp.get_context("forkserver")
        # Imported once in the fork server, before any sample's timeout starts (a worker importing a
        # slow library on its first sample would time out on a busy machine).
        self.ctx.set_forkserver_preload([fn.__module__, *preload])
        self._lock = threading.Lock()  # one map() at a time; callers from many threads queue here
        self._workers: list[tuple] = []
        self.timeouts = 0
        self.errors = 0
        self.budget_cuts = 0
        self.spawned: list[int] = []  # every worker pid ever started, for leak checks
        atexit.register(self.close)

    def _spawn(self):
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_worker, args=(child, self.fn, self.memory_limit), daemon=True)
        proc.start()
        self.spawned.append(proc.pid)
        child.close()
        return proc, parent

    def _kill(self, i: int) -> None:
        proc, conn = self._workers[i]
        proc.kill()
        proc.join()
        conn.close()
        self._workers[i] = self._spawn()

    def map(self, items: list[tuple], on_timeout=0.0, on_error=None, budget_s: float | None = None) -> list:
        """fn(*item) for every item, in order; `on_timeout` / `on_error` where a sample failed, and
        `on_timeout` for every sample still unscored `budget_s` seconds after the batch began."""
        batch_deadline = time.monotonic() + (budget_s if budget_s is not None else float("inf"))
        with self._lock:
            while len(self._workers) < self.size:
                self._workers.append(self._spawn())
            results: list = [None] * len(items)
            self.durations = [0.0] * len(items)  # seconds each sample took, timeouts included
            todo = deque(range(len(items)))
            pending = [deque() for _ in self._workers]  # indices each worker still owes
            started = [0.0] * len(self._workers)  # when its current sample began
            remaining = len(items)
            silent_deaths = 0
            while remaining:
                for w, owed in enumerate(pending):
                    if not owed and todo:
                        chunk = [todo.popleft() for _ in range(min(self.chunk_size, len(todo)))]
                        self._workers[w][1].send([(i, items[i]) for i in chunk])
                        owed.extend(chunk)
                        started[w] = time.monotonic()
                busy = [w for w, owed in enumerate(pending) if owed]
                deadline = min(min(started[w] for w in busy) + self.timeout_s, batch_deadline)
                ready = wait([self._workers[w][1] for w in busy], timeout=max(0.0, deadline - time.monotonic()))
                now = time.monotonic()
                if now >= batch_deadline and not ready:
                    self._cut(results, pending, todo, on_timeout)
                    return results
                for w in busy:
                    conn = self._workers[w][1]
                    if conn in ready:
                        try:
                            while pending[w] and conn.poll():  # drain: fewer wake-ups per sample
                                index, value = conn.recv()
                                pending[w].remove(index)
                                if value == "error":
                                    self.errors += 1
                                    value = on_error
                                results[index] = value
                                silent_deaths = 0
                                now = time.monotonic()
                                self.durations[index] = now - started[w]
                                remaining -= 1
                                started[w] = now
                        except (EOFError, OSError):  # the worker died (the OOM killer, say)
                            silent_deaths += 1
                            if silent_deaths >= MAX_SILENT_DEATHS:
                                raise PoolBroken(f"{silent_deaths} scoring workers in a row died before "
                                                 f"returning anything (running {self.fn.__module__}."
                                                 f"{self.fn.__name__})") from None
                            index = pending[w].popleft()
                            results[index] = on_error
                            self.errors += 1
                            remaining -= 1
                            todo.extendleft(reversed(pending[w]))
                            pending[w].clear()
                            self._kill(w)
                            started[w] = now
                    elif now - started[w] >= self.timeout_s:
                        index = pending[w].popleft()
                        results[index] = on_timeout
                        self.durations[index] = now - started[w]
                        self.timeouts += 1
                        remaining -= 1
                        todo.extendleft(reversed(pending[w]))  # the rest of its chunk, to others
                        pending[w].clear()
                        self._kill(w)
                        started[w] = now
            return results

    def _cut(self, results: list, pending: list, todo: deque, on_timeout) -> None:
        """The batch's budget ran out: what is unscored times out, and workers still busy are replaced."""
        for w, owed in enumerate(pending):
            if owed:
                self._kill(w)
        for index in [i for owed in pending for i in owed] + list(todo):
            results[index] = on_timeout
            self.budget_cuts += 1
            self.timeouts += 1

    def close(self) -> None:
        for proc, conn in self._workers:
            try:
                conn.send(None)
            except OSError:
                pass
            proc.join(timeout=1)
            if proc.is_alive():
                proc.kill()
                proc.join()
            conn.close()
        self._workers = []
