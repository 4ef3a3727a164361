"""Where a fused model ignores /think or /no_think: mode compliance and accuracy by difficulty level,
on TRAINING-split `synthetic_math` prompts (a diagnosis must not read the held-out set).

    .venv/bin/python benchmarks/mode_compliance.py MODEL_DIR [--n 200] [--seed 99] [--max-new-tokens 160]

Prints, per mode and level, the share of greedy completions that follow the flag
(toolkit.core.thinking.complies: an empty think block for no_think, one block with thinking in it
for think, closed or cut by the token limit) with its 95% interval, and the accuracy; `default` is
the prompt without a flag (as the stages' held-out evaluation asks), judged by the think layout
since thinking is the default.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from data_curation.sources import load_rows
from pipeline.store.home import configure_environment
from toolkit.core.stats import rate_interval
from toolkit.core.thinking import complies, flag_messages
from toolkit.rewards.verifiers import score_rows
from toolkit.rollouts import SamplingSpec, open_engine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--seed", type=int, default=99)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    args = ap.parse_args()
    configure_environment()
    rows = load_rows("synthetic_math", "train", args.n, args.seed, {})
    engine = open_engine(args.model)
    print(f"{args.model}: {len(rows)} training-split prompts (seed {args.seed}), greedy, {args.max_new_tokens} tokens, "
          f"{engine.describe()}")
    print(f"{'mode':9s} {'level':>5s} {'n':>4s}  {'compliance [95%]':24s} accuracy")
    by_level: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        by_level[str(r.get("difficulty"))].append(i)
    by_level = {**dict(sorted(by_level.items())), "all": list(range(len(rows)))}
    for mode in ("think", "no_think", "default"):
        done = [c[0] for c in engine.complete([flag_messages(r["prompt"], mode) for r in rows],
                                              SamplingSpec(max_new_tokens=args.max_new_tokens, batch_size=32))]
        texts = [c.text for c in done]
        follows = [complies(c.text, mode, cut=not c.finished) for c in done]
        scores = score_rows(rows, texts, after_think=True)
        for level, idx in by_level.items():
            c = rate_interval([float(follows[i]) for i in idx])
            acc = sum(scores[i] or 0 for i in idx) / len(idx)
            print(f"{mode:9s} {level:>5s} {len(idx):4d}  {c['mean']:.3f} [{c['lo']:.3f}, {c['hi']:.3f}]{'':6s} {acc:.3f}")
        failing = [texts[i] for i in range(len(rows)) if not follows[i]][:2]
        for t in failing:
            print(f"  not complying ({mode}): {t[:160]!r}")


if __name__ == "__main__":
    main()
