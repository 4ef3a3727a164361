"""The test harness `code_exec` runs inside the sandbox. Standard library only: its source is passed
to `python -I -S -c`, the job arrives as one JSON document on stdin, and the verdict leaves as one
JSON line on this process's stdout.

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
  calls into the child. Names the prefix or the tests define stay the trusted ones.
- This process makes itself non-dumpable before the child starts, so the child (same uid) cannot
  ptrace it or open its /proc files (memory, file descriptors). The verdict goes to this process's
  stdout, which the child never holds. If the child kills the harness, no verdict appears and the
  sample scores 0: any exit path other than "the tests ran and passed" is a failure.
- stdin/stdout cases run the program once per case in a fresh child and compare its output here.

Departure from the usual harnesses (HumanEval's, open-r1's): calls cross a process boundary, so a
test that passes a function as an argument, or checks that the candidate mutated its argument in
place, fails here. Competitive-programming and HumanEval/MBPP-style tests do neither.
"""

import ast
import builtins
import json
import os
import select
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
            kind = getattr(builtins, str(reply["raised"]), None)
            if isinstance(kind, type) and issubclass(kind, Exception):
                raise kind("raised by the candidate")
            raise RuntimeError(f"the candidate raised {reply['raised']}")
        return decode(reply["value"])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def run_function_tests(job: dict, deadline: float, events: dict) -> tuple[int, int]:
    """HumanEval `check(candidate)` (mode "check") or a list of assert statements (mode "asserts")."""
    tests = [job["test"]] if job["mode"] == "check" else list(job["tests"])
    state = {"child": None, "starts": 0}

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
            return child().call(name, args, kwargs, job["call_timeout_s"])
        candidate.__name__ = candidate.__qualname__ = name
        return candidate

    trusted = {"__name__": "__posttrain_tests__", "__builtins__": builtins}
    exec(compile(job.get("prefix") or "", "<prefix>", "exec"), trusted)
    if job["mode"] == "check":
        exec(compile(job["test"], "<tests>", "exec"), trusted)
    # Proxies only for names the tests use that neither the trusted code nor Python defines: a
    # completion that defines `abs` or `check` changes nothing the tests see.
    used = {n.id for t in tests for n in ast.walk(ast.parse(t)) if isinstance(n, ast.Name)}
    try:
        defined = child().names
    except Exception:  # it failed to load, timed out, or answered nonsense: every test fails
        return 0, len(tests)
    for name in defined:
        if name in used and name not in trusted and not hasattr(builtins, name):
            trusted[name] = proxy(name)
    if job.get("entry_point"):
        trusted[job["entry_point"]] = proxy(job["entry_point"])
    passed = 0
    for test in tests:
        if time.monotonic() >= deadline:
            break
        try:
            if job["mode"] == "check":
                trusted["check"](trusted[job["entry_point"]])
            else:
                exec(compile(test, "<test>", "exec"), trusted)
            passed += 1
        except Exception:  # a failed assert, a wrong type, a dead or slow candidate: that test fails
            pass
    if state["child"] is not None:
        state["child"].kill()
    return passed, len(tests)


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
        try:
            run = subprocess.run([job["python"], "-I", "-S", "prog.py"], input=str(case["input"]).encode(),
                                 capture_output=True, timeout=left, close_fds=True, start_new_session=True)
        except subprocess.TimeoutExpired:
            events["timeouts"] += 1
            continue
        if b"MemoryError" in run.stderr[-2000:]:
            events["memory_errors"] += 1
        if run.returncode == 0 and run.stdout.decode(errors="replace").split() == str(case["output"]).split():
            passed += 1
    return passed, len(job["cases"])


def undumpable() -> None:
    """PR_SET_DUMPABLE 0: a same-uid process may no longer ptrace us or open our /proc files."""
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")


def main() -> None:
    job = json.loads(sys.stdin.read())
    started = time.monotonic()
    deadline = started + float(job["budget_s"])
    events = {"timeouts": 0, "memory_errors": 0, "child_deaths": 0}
    undumpable()
    if job["mode"] == "io":
        passed, total = run_io_cases(job, deadline, events)
    else:
        passed, total = run_function_tests(job, deadline, events)
    verdict = {"passed": passed, "total": total, "events": events, "seconds": time.monotonic() - started}
    os.write(1, json.dumps(verdict).encode() + b"\n")


if __name__ == "__main__":
    main()
