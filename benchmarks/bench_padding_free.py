"""What padding-free batches, and the dense LM head, buy SFT: the stage's own `train_on_rows` on the
same rows, seed and steps, in turn, in one run (issue: fast generation; SFT is most of the demo
recipes' training time). `--compare layout` (the default): TRL's padded batches (the baseline, the
check made to fail), padding-free ones with attention over the block-causal mask (the per-row check
made to fail) and padding-free ones with attention row by row (what the stage picks where both
checks pass). `--compare head`: padding-free batches row by row, with TRL's fused LM head (the
baseline; it scores every position, and on a CPU folds each vocabulary tile in about a dozen torch
passes) and with `stages.dense_logps`'s dense head answering its calls (what the stage picks for a
float32 model on a CPU).

Rows: a file of rows with a `solution` (`--rows`, e.g. a run's `fusion_data/kept.jsonl`), or by
default a mix shaped like qwen3's demo fusion data from the shipped sources: long-CoT math of levels
1-3 and 5, general chat and instruction rows with and without thinking. Printed per run: seconds
of training (TRL's `train_runtime`), seconds per step, the first and last logged loss (the same
every way, up to float rounding), the share of a padded batch that is padding, and the ratios of
the padding-free times to the padded one and of row-by-row attention to the mask.

    .venv/bin/python benchmarks/bench_padding_free.py [--model smollm2-135m-instruct] [--rows FILE]
        [--steps 12] [--batch 4] [--max-length 192] [--rounds 2] [--compare layout|head]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
from pathlib import Path

from recipe_runs import positive_int, stage_arms_in_turn, table_header

TRL_HEAD = "TRL's fused head"  # the --compare head baseline


def default_rows() -> list[dict]:
    from data_curation.sources import load_rows

    parts = [("synthetic_math", 64, 9, {"difficulties": [1, 2, 3]}), ("synthetic_math", 32, 15, {"difficulties": [5]}),
             ("general_chat", 64, 1, {}), ("ifeval_synthetic", 64, 1, {"thinking": True}), ("ifeval_synthetic", 64, 2, {})]
    rows = [r for source, n, seed, params in parts for r in load_rows(source, "train", n, seed, params)]
    random.Random(0).shuffle(rows)
    return rows


def padding_share(rows: list[dict], model_dir: str, batch: int, max_length: int) -> float:
    """The share of a padded batch that is padding, over batches of `batch` rows in file order (the
    trainer shuffles the rows, so an estimate of its batches' share)."""
    from toolkit.rollouts import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    lengths = [min(max_length, len(tokenizer.apply_chat_template(
        r["prompt"] + [{"role": "assistant", "content": r["solution"]}], tokenize=True)["input_ids"])) for r in rows]
    chunks = [lengths[i:i + batch] for i in range(0, len(lengths), batch)]
    return 1 - sum(map(sum, chunks)) / sum(len(c) * max(c) for c in chunks)


def train(mode: str, model_dir: str, rows: list[dict], args) -> dict:
    import stages.dense_logps
    import stages.padding_free
    from stages import sft
    from stages.runtime import StageContext

    real_check, real_head = stages.padding_free.packing_mismatch, stages.dense_logps.answer_fused_head_densely
    if mode == TRL_HEAD:
        stages.dense_logps.answer_fused_head_densely = lambda model: False
    if mode == "padded":
        stages.padding_free.packing_mismatch = lambda *a, **k: "the baseline of this benchmark"
    elif mode == "padding-free, mask":
        stages.padding_free.packing_mismatch = lambda *a, attention=None: (
            "the mask arm of this benchmark" if attention else real_check(*a))
    slug = mode.replace(", ", "-").replace(" ", "-").replace("'", "")
    out = Path(tempfile.mkdtemp(prefix=f"bench-padding-free-{slug}-"))  # a model and a checkpoint: 2 GB
    try:
        cfg = sft.SFTConfig(name="bench", model=model_dir, data="rows", max_steps=args.steps,
                            per_device_batch_size=args.batch, learning_rate=1e-5, max_length=args.max_length,
                            save_steps=10_000)
        return sft.train_on_rows(cfg, StageContext.local(out), model_dir, rows)
    finally:
        stages.padding_free.packing_mismatch, stages.dense_logps.answer_fused_head_densely = real_check, real_head
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    from pipeline.models.named import resolve_model
    from pipeline.store.home import configure_environment

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--rows", type=Path)
    parser.add_argument("--steps", type=positive_int, default=12)
    parser.add_argument("--batch", type=positive_int, default=4)
    parser.add_argument("--max-length", type=positive_int, default=192)
    parser.add_argument("--rounds", type=positive_int, default=2, help="runs of each arm, in turn")
    parser.add_argument("--compare", choices=["layout", "head"], default="layout")
    args = parser.parse_args()
    configure_environment()
    model_dir = resolve_model(args.model)
    rows = [json.loads(line) for line in args.rows.read_text().splitlines()] if args.rows else default_rows()
    rows = [r for r in rows if r.get("solution")]
    share = padding_share(rows, model_dir, args.batch, args.max_length)
    print(f"{len(rows)} rows; {args.steps} steps of {args.batch}, max_length {args.max_length}; "
          f"padding in the padded batches: {share:.0%}", flush=True)
    print(table_header("run", "batches", "train s", "s per step", "first loss", "last loss", "tokens"))
    # each arm and the flags the stage must report for it
    flags = lambda free, per_row, dense: {"train/padding_free": free, "train/per_row_attention": per_row,
                                          "train/dense_lm_head": dense}
    modes = {"padded": flags(0.0, 0.0, 1.0), "padding-free, mask": flags(1.0, 0.0, 1.0),
             "padding-free, per row": flags(1.0, 1.0, 1.0)}
    if args.compare == "head":
        modes = {TRL_HEAD: flags(1.0, 1.0, 0.0), "dense head": flags(1.0, 1.0, 1.0)}
    total = stage_arms_in_turn(modes, args.rounds, lambda mode: train(mode, model_dir, rows, args),
                               lambda r, mode, m: (r, mode, f"{m['train/runtime_s']:.1f}",
                                                   f"{m['train/runtime_s'] / args.steps:.2f}", f"{m['train/first_loss']:.4f}",
                                                   f"{m['train/final_loss']:.4f}", f"{m['train/tokens']:.0f}"))
    if args.compare == "head":
        print(f"dense head / {TRL_HEAD} training time: {total['dense head'] / total[TRL_HEAD]:.2f}x "
              f"({total['dense head']:.1f} s against {total[TRL_HEAD]:.1f} s over {args.rounds} round(s))")
        return
    for mode in ("padding-free, mask", "padding-free, per row"):
        print(f"{mode} / padded training time: {total[mode] / total['padded']:.2f}x "
              f"({total[mode]:.1f} s against {total['padded']:.1f} s over {args.rounds} round(s))")
    print(f"per row / mask: {total['padding-free, per row'] / total['padding-free, mask']:.2f}x")


if __name__ == "__main__":
    main()
