"""Evidence for the RLHF stage kinds on `tiny`, beyond what the suite asserts:

1. a reward model on the hard synthetic preference, correct against wrong sums (`corrupted_answer`,
   answers off by 1-3), at two training budgets: held-out pairwise accuracy;
2. long2short DPO on a tiny model first fine-tuned on padded (verbose) thinking: greedy response
   length before and after, and held-out accuracy before and after.

    .venv/bin/python benchmarks/rlhf_evidence.py [--rm-steps 200 600] [--sft-steps 150] [--dpo-steps 40]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from data_curation.sources import load_rows
from pipeline.models.named import ensure_named_model
from pipeline.store.home import configure_environment
from stages import dpo, reward_model, sft
from stages.evaluate import EvalSpec, evaluate
from stages.preference_pairs import corrupted_pairs, padded_pairs
from stages.runtime import StageContext


def write_pairs(path: Path, pairs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rm-steps", type=int, nargs="+", default=[200, 600])
    ap.add_argument("--sft-steps", type=int, default=150)
    ap.add_argument("--dpo-steps", type=int, default=40)
    args = ap.parse_args()
    configure_environment()
    tiny = str(ensure_named_model("tiny-qwen3"))
    work = Path(tempfile.mkdtemp(prefix="rlhf-evidence-"))
    rows = load_rows("synthetic_math", "train", 1200, 0, {"difficulties": [1]})

    sums = write_pairs(work / "sums.jsonl", corrupted_pairs(rows))
    for steps in args.rm_steps:
        out = work / f"rm{steps}"
        out.mkdir()
        cfg = reward_model.RewardModelConfig(name="rm", model=tiny, pairs={"path": str(sums)}, max_steps=steps,
                                             per_device_batch_size=16, learning_rate=1e-3 if steps <= 200 else 3e-3,
                                             max_length=128, save_steps=10_000, eval_share=0.15)
        m = reward_model.run(cfg, StageContext.local(out, {"model": tiny, "pairs": {"path": str(sums)}})).metrics
        print(f"reward model, correct vs wrong sums, {steps} steps (lr {cfg.learning_rate}): held-out pairwise "
              f"accuracy {m['rm/pairwise_accuracy']:.2f} on {m['rm/eval_pairs']:.0f} pairs")

    short = rows[:600]
    pairs = padded_pairs(short, padding=2)
    padded = write_pairs(work / "padded.jsonl", pairs)
    (work / "verbose").mkdir()
    cfg = sft.SFTConfig(name="verbose", model=tiny, data="synthetic_math", max_steps=args.sft_steps,
                        per_device_batch_size=16, learning_rate=3e-3, max_length=384, save_steps=10_000)
    sft.train_on_rows(cfg, StageContext.local(work / "verbose"), tiny,
                      [{**r, "solution": p["rejected"]} for r, p in zip(short, pairs)])
    verbose = str(work / "verbose" / "model")
    (work / "dpo").mkdir()
    d = dpo.DPOConfig(name="short", model=verbose, pairs={"path": str(padded)}, max_steps=args.dpo_steps,
                      per_device_batch_size=8, learning_rate=1e-4, max_length=384, save_steps=10_000,
                      length_probe=16, length_probe_tokens=200)
    m = dpo.run(d, StageContext.local(work / "dpo", {"model": verbose, "pairs": {"path": str(padded)}})).metrics
    spec = EvalSpec(data={"source": "synthetic_math", "split": "eval", "n": 32, "params": {"difficulties": [1]}},
                    max_new_tokens=200)
    eval_rows = load_rows("synthetic_math", "eval", 32, 0, {"difficulties": [1]})
    before = evaluate(verbose, spec, eval_rows).metrics["eval/accuracy"]
    after = evaluate(str(work / "dpo" / "model"), spec, eval_rows).metrics["eval/accuracy"]
    print(f"long2short DPO (SFT {args.sft_steps} steps on padded thinking, DPO {args.dpo_steps} steps): greedy "
          f"response tokens {m['dpo/response_tokens_before']:.1f} -> {m['dpo/response_tokens_after']:.1f} "
          f"({m['dpo/response_tokens_after'] / m['dpo/response_tokens_before']:.2f}x); held-out accuracy "
          f"{before:.3f} -> {after:.3f}; DPO reward accuracy {m.get('dpo/reward_accuracies', float('nan')):.2f}, "
          f"margin {m.get('dpo/reward_margins', float('nan')):.2f}")


if __name__ == "__main__":
    main()
