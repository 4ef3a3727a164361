"""Throughput of the `code_exec` reward, in this checkout against an older commit, in one run.

    .venv/bin/python benchmarks/bench_code_reward.py [--baseline-ref 76abbed] [--n 64] [--parallel 2]

Scores the same completions on both sides: HumanEval's canonical solutions (all pass) and the same
problems answered with `return None` (all fail), alternating, `--n` in all. Each side runs in its own
process (`python -c`) from its own tree; the baseline's code comes from a temporary git worktree of
the ref. Prints samples/s per side, the ratio, and checks that both sides agree on every score.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCORE = r"""
import json, sys, time
from toolkit.rewards import get_reward
data = json.load(open(sys.argv[1]))
reward = get_reward("code_exec", timeout_s=10, parallel=int(sys.argv[2]))
reward(completions=data["completions"][:2], answer=data["answers"][:2])  # warm: bwrap probe, page cache
started = time.perf_counter()
scores = reward(completions=data["completions"], answer=data["answers"])
print(json.dumps({"seconds": time.perf_counter() - started, "scores": scores}))
"""


def completions(n: int) -> tuple[list[str], list[str]]:
    sys.path.insert(0, str(ROOT))
    from data_curation.sources import load_rows

    rows = load_rows("humaneval")
    texts, answers = [], []
    for i in range(n):
        row = rows[(i // 2) % len(rows)]
        spec = json.loads(row["answer"])
        if i % 2 == 0:
            code = row["solution"].removeprefix("```python\n").removesuffix("```")
        else:
            code = spec["prefix"] + "    return None\n"
        texts.append(f"<think>plan</think>\n```python\n{code}```")
        answers.append(row["answer"])
    return texts, answers


def side(tree: Path, data: Path, parallel: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", SCORE, str(data), str(parallel)], cwd=tree, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"scoring in {tree} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int | str:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline-ref", default="76abbed")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--parallel", type=int, default=2)
    args = ap.parse_args()
    if subprocess.run(["git", "rev-parse", "--verify", "-q", f"{args.baseline_ref}^{{commit}}"], cwd=ROOT,
                      capture_output=True).returncode != 0:
        return f"--baseline-ref {args.baseline_ref!r}: no such commit in {ROOT}"
    texts, answers = completions(args.n)
    with tempfile.TemporaryDirectory(prefix="bench-code-") as tmp:
        work = Path(tmp)
        data = work / "data.json"
        data.write_text(json.dumps({"completions": texts, "answers": answers}))
        baseline = work / "baseline"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(baseline), args.baseline_ref], cwd=ROOT,
                       check=True)
        try:
            before = side(baseline, data, args.parallel)
            after = side(ROOT, data, args.parallel)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(baseline)], cwd=ROOT, check=False)
    print(f"code_exec on {args.n} HumanEval completions (half canonical, half wrong), parallel={args.parallel}")
    print("| tree | seconds | samples/s | passed |")
    print("| --- | --- | --- | --- |")
    for name, r in ((f"baseline {args.baseline_ref}", before), ("this checkout", after)):
        print(f"| {name} | {r['seconds']:.2f} | {args.n / r['seconds']:.2f} | {sum(s == 1.0 for s in r['scores'])} |")
    print(f"ratio (this / baseline samples/s): {before['seconds'] / after['seconds']:.2f}x")
    if before["scores"] != after["scores"]:
        diff = [i for i, (a, b) in enumerate(zip(before["scores"], after["scores"])) if a != b]
        print(f"scores differ on {len(diff)} samples: {diff[:10]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
