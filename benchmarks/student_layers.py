"""Which of SmolLM2's layers the demo's distillation student keeps (issue: learning evidence).

The student is SmolLM2-135M-Instruct with some decoder layers removed (embeddings, final norm and
the kept layers copied, nothing re-initialised). Which layers decides whether distillation starts
from a language model or from noise. This script prints the perplexity of each candidate on
TRAINING-split text (synthetic_math solutions and general_chat responses in the chat template; the
held-out sets are not read):

- every other layer (0, 2, ..., 28): DistilBERT's initialisation, the student before 2026-12-02;
- for each start s, the 30 layers without the contiguous block s .. s + drop - 1 (the layer-pruning
  result of Gromov et al. 2024, "The Unreasonable Ineffectiveness of the Deeper Layers": a block of
  adjacent layers whose input and output are close can go, where scattered layers cannot).

    .venv/bin/python benchmarks/student_layers.py [--drop 6] [--rows 64]
    .venv/bin/python benchmarks/student_layers.py --drop 10 --save 9 DIR   # write one candidate, for
                                          # a distillation probe (--set stages.distill.student=DIR)

Forward passes only, one model built per candidate (7.4 min here on 2 cores, 2026-12-02).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from data_curation.sources import load_rows
from pipeline.models.builds import without_layers
from pipeline.models.named import ensure_named_model
from pipeline.store.home import configure_environment
from toolkit.core.templates import render_prompt


def calibration_texts(tokenizer, n: int) -> list[str]:
    rows = load_rows("synthetic_math", "train", n=n, seed=123) + load_rows("general_chat", "train", n=n // 4, seed=123)
    return [tokenizer.apply_chat_template(render_prompt("chat", r) + [{"role": "assistant", "content": r["solution"]}],
                                          tokenize=False) for r in rows]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drop", type=int, default=6, help="layers removed (6 of 30: the demo student's size)")
    ap.add_argument("--rows", type=int, default=64, help="synthetic_math rows (and a quarter as many general_chat)")
    ap.add_argument("--save", nargs=2, metavar=("START", "DIR"), help="write the student without layers START .. "
                    "START + drop - 1 (model and tokenizer) into DIR, and measure nothing")
    args = ap.parse_args()
    configure_environment()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    teacher_dir = ensure_named_model("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(teacher_dir)
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32).eval()
    if args.save:
        start, out = int(args.save[0]), Path(args.save[1])
        without_layers(teacher, range(start, start + args.drop)).save_pretrained(out)
        tokenizer.save_pretrained(out)
        print(f"{out}: SmolLM2 without layers {start}-{start + args.drop - 1}")
        return 0
    batch = tokenizer(calibration_texts(tokenizer, args.rows), return_tensors="pt", padding=True)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)

    def perplexity(model) -> float:
        with torch.no_grad():
            return math.exp(model(**batch, labels=labels).loss.item())

    layers = teacher.config.num_hidden_layers
    print(f"{len(labels)} training-split texts, {int(batch['attention_mask'].sum())} tokens; "
          f"teacher (all {layers} layers): perplexity {perplexity(teacher):.1f}\n")
    print("| layers kept | perplexity |\n| --- | --- |")
    print(f"| every other (0, 2, ..., {layers - 2}) | {perplexity(without_layers(teacher, range(1, layers, 2))):.0f} |")
    for start in range(layers - args.drop):  # the last layer always stays
        block = range(start, start + args.drop)
        print(f"| all but {start}-{block[-1]} | {perplexity(without_layers(teacher, block)):.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
