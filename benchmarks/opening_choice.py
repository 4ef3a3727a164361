"""Which solution template a model opens its thinking with, by difficulty level.

`synthetic_math`'s levels 1-3 open their worked solutions differently ("I need to add ...",
"I need to multiply ...", "Multiplication comes before addition."), and the first token of the
thinking picks the template. For each model and level, on TRAINING-split prompts (the probes' seed
99, never trained on), the script prints the mean probability of the gold solution's first thinking
token after `<think>\\n`, and on how many prompts that token is the model's most likely one. A GRPO
stage that moves one level's prompts onto another level's template shows here as a fall in both.

    PYTHONPATH=. .venv/bin/python benchmarks/opening_choice.py MODEL_DIR [MODEL_DIR ...] [--n 40]
"""

from __future__ import annotations

import argparse
import sys

from recipe_runs import ROOT, table_header, table_row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--n", type=int, default=40, help="prompts per level")
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3])
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from data_curation.sources import load_rows
    from toolkit.core.templates import render_prompt

    rows = list(load_rows("synthetic_math", "train", a.n * len(a.levels), 99, {"difficulties": a.levels}))
    print(table_header("model", *[f"level {lv}: p(gold opening), argmax" for lv in a.levels]))
    for path in a.models:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        cells = []
        for level in a.levels:
            probs, top = [], 0
            for row in [r for r in rows if r["difficulty"] == level][:a.n]:
                prompt = tokenizer.apply_chat_template(render_prompt("chat", row), tokenize=False,
                                                       add_generation_prompt=True) + "<think>\n"
                thinking = row["solution"].split("<think>\n", 1)[1]
                gold = tokenizer(prompt + thinking, add_special_tokens=False).input_ids
                ids = tokenizer(prompt, add_special_tokens=False).input_ids
                if gold[:len(ids)] != ids:  # the opening token must not merge with the prompt's last
                    raise SystemExit(f"{path}: the prompt's tokens change when its solution follows")
                with torch.no_grad():
                    dist = torch.softmax(model(torch.tensor([ids])).logits[0, -1], -1)
                opening = gold[len(ids)]
                probs.append(dist[opening].item())
                top += int(dist.argmax().item() == opening)
            cells.append(f"{sum(probs) / len(probs):.3f}, {top}/{len(probs)}")
        print(table_row(path, *cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
