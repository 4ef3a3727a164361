"""The test harness `code_exec` runs inside the sandbox. Standard library only: its source is passed
to `python -I -S -c`, the job arrives as one JSON document on stdin, and the verdict leaves as one
JSON line on a private pipe whose fd number is `sys.argv[1]` (toolkit/rewards/sandbox.py).

Why it is built this way: a completion that runs in the same process as its tests can rewrite how
they run and how their result is reported (shadow `exec` or `print`, patch builtins, register an
`atexit` hook that prints a forged result, exit early with status 0). So the completion never runs
in this process:

- The completion runs in a CHILD process that holds only two pipes to this harness (its
  stdin/stdout are moved to /dev/null). It executes the program, reports which names it defined,
  then answers calls: arguments in, return value out, both as plain data (None, bool, int, float,
  str, bytes, complex, and lists, tuples, dicts, sets of those). Nothing else crosses: no object the
  completion made can reach the tests, so no custom `__eq__`, no shadowed builtin, no patched module.
- The tests run HERE, with the row's trusted prefix code; the function under test is a proxy that
  calls into the child. Which names are the completion's is decided by the tests' own namespace:
  the entry point (or, without one, the single name every test calls that trusted code does not
  define). Any other name the tests need and trusted code does not define (a missing `import math`,
  say) makes the row a data error, reported as such, never resolved from the completion.
- A call that raised in the child, of any type (StopIteration, GeneratorExit, SystemExit,
  KeyboardInterrupt, BaseException subclasses), or died or timed out, fails the test it happened
  in, whatever the test code did with the exception: `all(map(f, xs))` stops early on a
  StopIteration, and a test that swallows exceptions would pass.

Who can reach the verdict: this process is the sandbox's pid 1 (bwrap `--as-pid-1`), so no bwrap
reaper inside holds any of our pipes, the child cannot signal us (a namespace's init receives only
the signals it handles, and we handle none), and our exit kills every process left in the sandbox.
We make ourselves non-dumpable before the child starts, so the child (same uid) cannot open our
/proc files, and the sandbox's seccomp filter denies ptrace, pidfd_open, pidfd_getfd and
process_vm_* outright. The result pipe is held by us alone (children are started with close_fds),
and the verdict carries the job's one-time nonce, which only this process's memory holds. The host
accepts exactly one verdict line, with the right nonce, from a harness that exited 0; anything else
scores 0.

Departure from the usual harnesses (HumanEval's, open-r1's): calls cross a process boundary, so a
test that passes a function as an argument, or checks that the candidate mutated its argument in
place, fails here. Competitive-programming and HumanEval/MBPP-style tests do neither.
"""

import ast
import builtins
import json
import os
import resource
import select
import signal
import subprocess
import sys
import time

CHILD = r'''
import json, os, sys
rfd, wfd = os.dup(0), os.dup(1)
null = os.open(os.devnull, os.O_RDWR)
os.dup2(null, 0); os.dup2(null, 1)
rx, tx = os.fdopen(rfd, "rb"), os.fdopen(wfd, "wb")
ENCODE_DECODE
def send(msg):
    tx.write(json.dumps(msg).encode() + b"\n"); tx.flush()
program = json.loads(rx.readline())
ns = {"__name__": "__main__", "__builtins__": __builtins__}
try:
    exec(compile(program, "<completion>", "exec"), ns)
except BaseException as e:
    send({"load_error": type(e).__name__}); tx.close(); os._exit(0)
send({"ready": sorted(k for k, v in ns.items() if callable(v) and type(v).__name__ != "module")})
while True:
    line = rx.readline()
    if not line:
        os._exit(0)
    req = json.loads(line)
    try:
        value = ns[req["fn"]](*decode(req["args"]), **dict(decode(req["kwargs"])))
        send({"id": req["id"], "value": encode(value)})
    except BaseException as e:
        send({"id": req["id"], "raised": type(e).__name__})
'''

ENCODE_DECODE = r'''
TAGS = {"l": list, "t": tuple, "s": set, "z": frozenset}
def encode(v, depth=0):
    if depth > 64:
        raise ValueError("value nested too deeply")
    if v is None or type(v) in (bool, str, int):
        return v
    if type(v) is float:
        return v if v == v and v not in (float("inf"), float("-inf")) else {"f": repr(v)}
    for tag, kind in TAGS.items():
        if type(v) is kind:
            return {tag: [encode(x, depth + 1) for x in v]}
    if type(v) is dict:
        return {"d": [[encode(k, depth + 1), encode(x, depth + 1)] for k, x in v.items()]}
    if type(v) is bytes:
        return {"b": v.hex()}
    if type(v) is complex:
        return {"c": [v.real, v.imag]}
    raise TypeError("cannot pass a " + type(v).__name__ + " across the sandbox")
def decode(v, depth=0):
    if depth > 64:
        raise ValueError("value nested too deeply")
    if v is None or type(v) in (bool, str, int, float):
        return v
    if type(v) is not dict or len(v) != 1:
        raise ValueError("malformed value")
    (tag, x), = v.items()
    if tag in TAGS:
        return TAGS[tag](decode(e, depth + 1) for e in x)
    if tag == "d":
        return {decode(k, depth + 1): decode(e, depth + 1) for k, e in x}
    if tag == "f":
        return float({"nan": "nan", "inf": "inf", "-inf": "-inf"}[x])
    if tag == "b":
        return bytes.fromhex(x)
    if tag == "c":
        return complex(float(x[0]), float(x[1]))
    raise ValueError("malformed value")
'''
_codec: dict = {}
exec(ENCODE_DECODE, _codec)  # the harness decodes with the same functions the child encodes with
encode, decode = _codec["encode"], _codec["decode"]
MAX_MESSAGE = 16 << 20


class ChildDied(Exception):
    pass


class CandidateFailed(BaseException):
    """A call into the completion raised, died or ran out of time. A BaseException, so that test
    code's `except Exception` does not swallow it; the test fails even where test code catches it."""


class DataError(Exception):
    """The row's tests cannot be run as given (a name they use is defined nowhere trusted)."""


class Child:
    """The completion's process, and calls into it with a deadline."""

    def __init__(self, python: str, program: str, deadline: float, events: dict):
        self.events, self.deadline, self.buffer, self.next_id = events, deadline, b"", 0
        self.proc = subprocess.Popen([python, "-I", "-S", "-c", CHILD.replace("ENCODE_DECODE", ENCODE_DECODE)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     close_fds=True, start_new_session=True)
        self.proc.stdin.write(json.dumps(program).encode() + b"\n")
        self.proc.stdin.flush()
        ready = self.receive(self.deadline)
        if "load_error" in ready:
            self.note_error(ready["load_error"])
            raise ChildDied("the program failed to load: " + str(ready["load_error"]))
        self.names = [n for n in ready.get("ready", []) if isinstance(n, str)]

    def note_error(self, name) -> None:
        if name == "MemoryError":
            self.events["memory_errors"] += 1

    def receive(self, until: float) -> dict:
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            left = until - time.monotonic()
            if left <= 0:
                self.events["timeouts"] += 1
                self.kill()
                raise TimeoutError("the call ran past its time")
            if not select.select([fd], [], [], left)[0]:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk or len(self.buffer) > MAX_MESSAGE:
                self.events["child_deaths"] += 1
                self.kill()
                raise ChildDied("the program's process ended")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        message = json.loads(line)
        if type(message) is not dict:
            raise ValueError("malformed reply")
        return message

    def call(self, name: str, args: tuple, kwargs: dict, timeout_s: float):
        self.next_id += 1
        request = {"id": self.next_id, "fn": name, "args": encode(list(args)), "kwargs": encode(kwargs)}
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:
            self.events["child_deaths"] += 1
            raise ChildDied("the program's process ended") from None
        until = min(self.deadline, time.monotonic() + timeout_s)
        while True:
            reply = self.receive(until)
            if reply.get("id") == self.next_id:
                break
        if "raised" in reply:
            self.note_error(reply["raised"])
            raise CandidateFailed(f"the candidate raised {str(reply['raised'])[:100]}")
        return decode(reply["value"])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def free_names(source: str) -> set[str]:
    """Names a piece of test code reads that it does not bind anywhere itself (an over-approximation
    of what it binds: a name bound anywhere counts as its own)."""
    tree = ast.parse(source)
    loaded, bound = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return loaded - bound


def candidate_names(job: dict, tests: list[str], trusted: dict) -> set[str]:
    """The names the tests take from the completion: the entry point(s), or the one name every test
    needs that trusted code and Python do not define. Raises DataError when any other name is
    missing, or no single candidate can be told apart."""
    needed = [{n for n in free_names(t) if n not in trusted and not hasattr(builtins, n)} for t in tests]
    entry = job.get("entry_point")
    if entry:
        names = {entry} if isinstance(entry, str) else set(entry)
    else:
        common = set.intersection(*needed) if needed else set()
        if len(common) != 1:
            raise DataError(f"no entry point given and the tests share {len(common)} undefined names "
                            f"({sorted(common)[:5]}); name the function under test as entry_point")
        names = common
    missing = set().union(*needed) - names
    if missing:
        raise DataError(f"the tests use {sorted(missing)[:5]}, which neither they nor their prefix define")
    return names


def run_function_tests(job: dict, deadline: float, events: dict) -> tuple[int, int]:
    """HumanEval `check(candidate)` (mode "check") or a list of assert statements (mode "asserts")."""
    tests = [job["test"]] if job["mode"] == "check" else list(job["tests"])
    state = {"child": None, "starts": 0, "failed": False}

    def child() -> Child:
        current = state["child"]
        if current is None or current.proc.poll() is not None:
            if state["starts"] >= 3:
                raise ChildDied("the program's process died too often")
            state["starts"] += 1
            state["child"] = Child(job["python"], job["program"], deadline, events)
        return state["child"]

    def proxy(name):
        def candidate(*args, **kwargs):
            try:
                return child().call(name, args, kwargs, job["call_timeout_s"])
            except BaseException as e:  # raised, died, timed out, unencodable: this test fails
                state["failed"] = True
                raise CandidateFailed(str(e)[:200]) from None
        candidate.__name__ = candidate.__qualname__ = name
        return candidate

    trusted = {"__name__": "__posttrain_tests__", "__builtins__": builtins}
    exec(compile(job.get("prefix") or "", "<prefix>", "exec"), trusted)
    if job["mode"] == "check":
        exec(compile(job["test"], "<tests>", "exec"), trusted)
        if not callable(trusted.get("check")):
            raise DataError("the test code defines no check(candidate)")
    names = candidate_names(job, tests, trusted)
    try:
        child()
    except Exception:  # it failed to load, timed out, or answered nonsense: every test fails
        return 0, len(tests)
    for name in names:  # a completion that defines `abs` or `check` changes nothing the tests see
        trusted[name] = proxy(name)
    passed = 0
    for test in tests:
        if time.monotonic() >= deadline:
            break
        state["failed"] = False
        try:
            if job["mode"] == "check":
                trusted["check"](trusted[job["entry_point"]])
            else:
                exec(compile(test, "<test>", "exec"), trusted)
            passed += not state["failed"]
        except BaseException:  # a failed assert, a wrong type, a dead or slow candidate: that test fails
            pass
    if state["child"] is not None:
        state["child"].kill()
    return passed, len(tests)


def run_bounded(argv: list[str], data: bytes, timeout_s: float, cap: int) -> tuple[int | None, bytes, bytes]:
    """(returncode or None when it ran past `timeout_s` or wrote more than `cap` bytes, stdout,
    stderr's tail). Output is read as it comes and never held past `cap`."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            close_fds=True, start_new_session=True)
    out, err, until = b"", b"", time.monotonic() + timeout_s
    try:
        try:
            proc.stdin.write(data)
            proc.stdin.close()
        except OSError:
            pass
        open_fds = {proc.stdout.fileno(), proc.stderr.fileno()}
        while open_fds:
            left = until - time.monotonic()
            if left <= 0:
                return None, out, err
            for fd in select.select(list(open_fds), [], [], left)[0]:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    open_fds.discard(fd)
                elif fd == proc.stdout.fileno():
                    out += chunk
                    if len(out) > cap:
                        return None, out, err
                else:
                    err = (err + chunk)[-4096:]
        try:
            return proc.wait(timeout=max(0.0, until - time.monotonic())), out, err
        except subprocess.TimeoutExpired:
            return None, out, err
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def run_io_cases(job: dict, deadline: float, events: dict) -> tuple[int, int]:
    """Each case: the program with the case's input on stdin; passes when the output's
    whitespace-separated tokens equal the expected output's."""
    with open("prog.py", "w") as f:
        f.write(job["program"])
    passed = 0
    for case in job["cases"]:
        left = min(deadline - time.monotonic(), job["call_timeout_s"])
        if left <= 0:
            break
        expected = str(case["output"])
        cap = 4 * len(expected.encode()) + 4096  # room for whitespace differences, not for a flood
        code, out, err = run_bounded([job["python"], "-I", "-S", "prog.py"], str(case["input"]).encode(), left, cap)
        if code is None:
            events["timeouts"] += 1
            continue
        if b"MemoryError" in err[-2000:]:
            events["memory_errors"] += 1
        if code == 0 and out.decode(errors="replace").split() == expected.split():
            passed += 1
    return passed, len(job["cases"])


def undumpable() -> None:
    """PR_SET_DUMPABLE 0: a same-uid process may no longer ptrace us or open our /proc files."""
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")


def main() -> None:
    channel = int(sys.argv[1])
    os.set_inheritable(channel, False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as pid 1, a signal we do not handle never arrives
    job = json.loads(sys.stdin.read())
    started = time.monotonic()
    deadline = started + float(job["budget_s"])
    events = {"timeouts": 0, "memory_errors": 0, "child_deaths": 0}
    undumpable()
    if os.getpid() == 1:  # in the sandbox's own namespaces, RLIMIT_NPROC counts the sandbox's processes alone
        n = int(job["max_procs"])
        resource.setrlimit(resource.RLIMIT_NPROC, (n, n))
    verdict = {"nonce": job["nonce"]}
    try:
        if job["mode"] == "io":
            passed, total = run_io_cases(job, deadline, events)
        else:
            passed, total = run_function_tests(job, deadline, events)
        verdict.update(passed=passed, total=total, events=events, seconds=time.monotonic() - started)
    except (DataError, SyntaxError) as e:  # the row's own code is broken: nobody can pass or fail it
        verdict["data_error"] = f"{type(e).__name__}: {e}"[:500]
    os.write(channel, json.dumps(verdict).encode() + b"\n")
    os.close(channel)


if __name__ == "__main__":
    main()
