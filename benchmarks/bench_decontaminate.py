"""Decontamination speed: data_curation.decontaminate (bulk-hashed n-grams, exact confirmation)
against a plain Python implementation of the same rule (sets of n-gram tuples), in one run.

Training side: 200,000 prompts of 20-80 words drawn from a 6,000-word vocabulary, with 1,000 rows
planted from eval items (500 verbatim inside other text, 500 with every tenth word replaced).
Eval side: 5,000 items: CHAMP (270) and HumanEval (164) prompts, plus generated text. Both
implementations run in their own process (peak memory is that process's max RSS) and must flag
exactly the same rows.

Usage: .venv/bin/python benchmarks/bench_decontaminate.py [--train 200000] [--eval 5000] [--ngram 8]
"""

import argparse
import hashlib
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def make_data(n_train: int, n_eval: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    from data_curation.sources import load_rows

    r = random.Random(seed)
    vocab = ["".join(r.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(r.randint(2, 9))) for _ in range(6000)]
    text = lambda k: " ".join(r.choice(vocab) for _ in range(k))
    evals = load_rows("champ", "all") + load_rows("humaneval", "all")
    evals += [{"id": f"gen/{i}", "prompt": [{"role": "user", "content": text(r.randint(20, 60))}]}
              for i in range(n_eval - len(evals))]
    train = [{"id": f"train/{i}", "prompt": [{"role": "user", "content": text(r.randint(20, 80))}]}
             for i in range(n_train)]
    for k in range(1000):  # planted contamination
        item = evals[r.randrange(len(evals))]["prompt"][-1]["content"]
        if k % 2:
            words = item.split()
            item = " ".join(r.choice(vocab) if j % 10 == 5 else w for j, w in enumerate(words))
        train[r.randrange(n_train)]["prompt"][-1]["content"] = f"{text(5)} {item} {text(5)}"
    return train, evals


def plain(train: list[dict], evals: list[dict], n: int) -> list[str]:
    def grams(t):
        words = " ".join(t.lower().split()).split()
        return zip(*(words[i:] for i in range(n)))
    eval_set = {g for e in evals for g in grams(e["prompt"][-1]["content"])}
    return [row["id"] for row in train if any(g in eval_set for g in grams(row["prompt"][-1]["content"]))]


def ours(train: list[dict], evals: list[dict], n: int) -> list[str]:
    from data_curation.decontaminate import build_index, decontaminate
    index = build_index(evals, n)
    return [row["id"] for row, evidence in decontaminate(train, index, "any") if evidence]


def child(impl: str, n_train: int, n_eval: int, n: int) -> None:
    train, evals = make_data(n_train, n_eval)
    started = time.perf_counter()
    flagged = {"plain": plain, "ours": ours}[impl](train, evals, n)
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "flagged": len(flagged),
                      "digest": hashlib.sha256("\n".join(flagged).encode()).hexdigest(),
                      "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", type=int, default=200_000)
    ap.add_argument("--eval", type=int, default=5000)
    ap.add_argument("--ngram", type=int, default=8)
    ap.add_argument("--child", choices=["plain", "ours"])
    a = ap.parse_args()
    if a.child:
        child(a.child, a.train, a.eval, a.ngram)
        return 0
    results = {}
    for impl in ("plain", "ours"):
        out = subprocess.run([sys.executable, __file__, "--child", impl, "--train", str(a.train), "--eval",
                              str(a.eval), "--ngram", str(a.ngram)], check=True, capture_output=True, text=True)
        results[impl] = json.loads(out.stdout.strip().splitlines()[-1])
    p, o = results["plain"], results["ours"]
    print(f"{a.train} training prompts x {a.eval} eval items, {a.ngram}-grams, mode any")
    print("| implementation | seconds | rows/s | flagged | peak RSS (process) |")
    print("| --- | --- | --- | --- | --- |")
    for name, r in (("plain Python (sets of tuples)", p), ("posttrain (bulk hashed)", o)):
        print(f"| {name} | {r['seconds']:.2f} | {a.train / r['seconds']:,.0f} | {r['flagged']} | {r['max_rss_mb']:.0f} MB |")
    from data_curation.sources import load_rows
    from toolkit.core.text import question_text

    real = load_rows("champ", "all") + load_rows("humaneval", "all")
    short = sum(len(question_text(r).split()) < a.ngram for r in real)
    print(f"real benchmark items (CHAMP + HumanEval) with fewer than {a.ngram} words, which no {a.ngram}-gram "
          f"can match: {short} of {len(real)}")
    same = p["digest"] == o["digest"]
    print(f"speed-up {p['seconds'] / o['seconds']:.2f}x; identical flagged rows: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
