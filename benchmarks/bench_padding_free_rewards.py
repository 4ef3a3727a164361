"""What padding-free batches buy reward-model training: the `reward_model` stage's own `run` on the
same pairs, seed and steps, with TRL's padded preference batches (the baseline, the packing check made
to fail) and with flat ones, every response end to end and attention row by row (what the stage picks
where its checks pass), in turn, in one run (issues: fast generation, learning evidence; r1's two
reward models are about 3 minutes of its demo run).

Pairs: r1's two demo datasets, made as its `preference_pairs` stages make them from the shipped
synthetic math: `whole` (concise against padded thinking, whole responses: r1's rm_whole) or
`helpful` (right against wrong answer, the summary only: rm_helpful). Printed per run: seconds of
training (TRL's `train_runtime`), seconds per step, the first and last logged loss and the held-out
pairwise accuracy (the same both ways, up to float rounding), and the share of a padded batch that is
padding; then the ratio of the flat batches' training time to the padded ones'.

    .venv/bin/python benchmarks/bench_padding_free_rewards.py [--model smollm2-135m-instruct]
        [--pairs whole|helpful] [--steps 8] [--batch 4] [--rounds 2]
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
from pathlib import Path

from recipe_runs import positive_int, stage_arms_in_turn, table_header

# r1's demo reward models: (pair-making mode and seed of its preference_pairs stage, reward scope)
DATASETS = {"whole": ("padded_thinking", 4, "full"), "helpful": ("corrupted_answer", 2, "answer")}
MAX_LENGTH = 384  # both of r1's reward models


def make_pairs(name: str) -> tuple[list[dict], str]:
    from data_curation.sources import load_rows
    from stages.preference_pairs import corrupted_pairs, padded_pairs

    mode, seed, scope = DATASETS[name]
    rows = load_rows("synthetic_math", "train", 512, seed)
    pairs = padded_pairs(rows, padding=2) if mode == "padded_thinking" else corrupted_pairs(rows, seed=0)
    return pairs, scope


def padding_share(pairs: list[dict], model_dir: str, batch: int, scope: str) -> float:
    """The share of a padded batch that is padding, over random batches of `batch` pairs (the trainer
    shuffles the pairs, so an estimate of its batches' share)."""
    from stages.reward_model import scoped_pairs
    from toolkit.rollouts import load_tokenizer

    tokenizer = load_tokenizer(model_dir)

    def length(prompt, response):
        return len(tokenizer.apply_chat_template(prompt + [{"role": "assistant", "content": response}],
                                                 tokenize=True)["input_ids"])

    lengths = [(length(p["prompt"], p["chosen"]), length(p["prompt"], p["rejected"])) for p in scoped_pairs(pairs, scope)[0]]
    rng, real, padded = random.Random(0), 0, 0
    for _ in range(1000):
        sides = [n for pair in rng.sample(lengths, batch) for n in pair]
        real, padded = real + sum(sides), padded + len(sides) * max(sides)
    return 1 - real / padded


def train(arm: str, model_dir: str, pairs_file: Path, scope: str, args) -> dict:
    import stages.reward_model
    from stages.reward_model import RewardModelConfig
    from stages.runtime import StageContext

    real_choice = stages.reward_model.reward_padding_free
    if arm == "padded":
        stages.reward_model.reward_padding_free = lambda *a, **k: (False, {})
    out = Path(tempfile.mkdtemp(prefix=f"bench-padding-free-rewards-{arm}-"))  # a model and a checkpoint
    try:
        cfg = RewardModelConfig(name="bench", model=model_dir, pairs="pairs", scope=scope, max_steps=args.steps,
                                per_device_batch_size=args.batch, learning_rate=1e-4, max_length=MAX_LENGTH,
                                save_steps=10_000)
        ctx = StageContext.local(out, {"model": model_dir, "pairs": {"path": str(pairs_file)}}, "reward_model")
        return stages.reward_model.run(cfg, ctx).metrics
    finally:
        stages.reward_model.reward_padding_free = real_choice
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    from data_curation.report import write_jsonl
    from pipeline.models.named import resolve_model
    from pipeline.store.home import configure_environment

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--pairs", choices=sorted(DATASETS), default="whole")
    parser.add_argument("--steps", type=positive_int, default=8)
    parser.add_argument("--batch", type=positive_int, default=4)
    parser.add_argument("--rounds", type=positive_int, default=2, help="runs of each arm, in turn")
    args = parser.parse_args()
    configure_environment()
    model_dir = resolve_model(args.model)
    pairs, scope = make_pairs(args.pairs)
    share = padding_share(pairs, model_dir, args.batch, scope)
    print(f"{len(pairs)} {args.pairs} pairs (scope {scope}); {args.steps} steps of {args.batch} pairs; "
          f"padding in the padded batches: {share:.0%}", flush=True)
    print(table_header("run", "batches", "train s", "s per step", "first loss", "last loss", "held-out pairwise accuracy"))
    # each arm and the (train/padding_free, train/per_row_attention) the stage must report for it
    arms = {"padded": {"train/padding_free": 0.0, "train/per_row_attention": 0.0},
            "flat, per row": {"train/padding_free": 1.0, "train/per_row_attention": 1.0}}
    with tempfile.TemporaryDirectory(prefix="bench-pairs-") as tmp:
        pairs_file = Path(tmp) / "pairs.jsonl"
        write_jsonl(pairs_file, pairs)
        total = stage_arms_in_turn(
            arms, args.rounds, lambda arm: train(arm, model_dir, pairs_file, scope, args),
            lambda r, arm, m: (r, arm, f"{m['train/runtime_s']:.1f}", f"{m['train/runtime_s'] / args.steps:.2f}",
                               f"{m['train/first_loss']:.4f}", f"{m['train/final_loss']:.4f}",
                               f"{m['rm/pairwise_accuracy']:.3f} [{m['rm/pairwise_accuracy_lo']:.3f}, "
                               f"{m['rm/pairwise_accuracy_hi']:.3f}] of {m['rm/eval_pairs']:.0f}"))
    print(f"flat, per row / padded training time: {total['flat, per row'] / total['padded']:.2f}x "
          f"({total['flat, per row']:.1f} s against {total['padded']:.1f} s over {args.rounds} round(s))")

if __name__ == "__main__":
    main()
