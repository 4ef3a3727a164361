"""Why a small thinking budget can score below no thinking: one model's greedy answers on
TRAINING-split prompts (never the held-out set) at budget 0, at a budget with the recipe's answer
limit and with a longer one, at a larger budget and unlimited. Prints accuracy with its 95% interval,
unfinished and boxed answers, answers that show working after the thinking (an `=` there: budget 0
renders an empty think block into the prompt, and a model that ignores it reasons in its answer), the
paired changes that say whether the answer limit is the cause, and the first completions to read at
budget 0 and at the cut.

    .venv/bin/python benchmarks/budget_answer_limit.py MODEL [--budget 16] [--answer 32] [--long-answer 80]
"""

from __future__ import annotations

import argparse
import sys

from recipe_runs import ROOT, positive_int, table_header, table_row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--prompts", type=positive_int, default=200)
    ap.add_argument("--budget", type=positive_int, default=16)
    ap.add_argument("--larger-budget", type=positive_int, default=64)
    ap.add_argument("--answer", type=positive_int, default=32, help="the qwen3 recipe's answer_max_new_tokens")
    ap.add_argument("--long-answer", type=positive_int, default=80)
    ap.add_argument("--max-new-tokens", type=positive_int, default=80, help="the demo evaluation's")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from data_curation.sources import load_rows
    from pipeline.models.named import resolve_model
    from pipeline.store.home import configure_environment
    from toolkit.core.stats import paired_change, rate_interval
    from toolkit.core.text import split_thinking
    from toolkit.rewards.verifiers import score_rows
    from toolkit.rollouts import SamplingSpec, open_engine

    configure_environment()
    rows = load_rows("synthetic_math", "train", a.prompts, 99, {})  # all levels, as the held-out set
    engine = open_engine(str(resolve_model(a.model)), "auto")
    settings = {"budget 0": (0, a.answer), f"budget {a.budget}, answer {a.answer}": (a.budget, a.answer),
                f"budget {a.budget}, answer {a.long_answer}": (a.budget, a.long_answer),
                f"budget {a.larger_budget}, answer {a.answer}": (a.larger_budget, a.answer),
                "unlimited": (None, a.answer)}
    scores, shown = {}, {}
    print(f"{len(rows)} training-split prompts, greedy, {a.max_new_tokens} tokens, {a.model}\n")
    print(table_header("setting", "accuracy [95%]", "unfinished", "boxed after the thinking", "working after the thinking",
                       "mean tokens"))
    for name, (budget, answer) in settings.items():
        done = [c[0] for c in engine.complete([r["prompt"] for r in rows], SamplingSpec(
            max_new_tokens=a.max_new_tokens, batch_size=64, thinking_budget=budget, answer_max_new_tokens=answer))]
        scores[name] = score_rows(rows, [c.text for c in done], answer_tags=False, after_think=True)
        rate = rate_interval(scores[name])
        answers = [split_thinking(c.text)[1] or "" for c in done]
        print(table_row(name, f"{rate['mean']:.3f} [{rate['lo']:.3f}, {rate['hi']:.3f}]", sum(not c.finished for c in done),
                        sum("boxed" in t for t in answers), sum("=" in t for t in answers),
                        f"{sum(c.tokens for c in done) / len(done):.1f}"), flush=True)
        if budget == 0 or (budget == a.budget and answer == a.long_answer):
            shown[name] = [c.text for c in done[:3]]
    names = list(settings)
    for after, before in [(names[2], names[1]), (names[1], names[0])]:
        c = paired_change(scores[before], scores[after])
        print(f"\n{after} against {before}: {c['delta']:+.3f} [{c['lo']:+.3f}, {c['hi']:+.3f}], paired, n = {c['n']:.0f}")
    for name, texts in shown.items():
        print(f"\nThe first completions, {name}:")
        for text in texts:
            print(f"- {text!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
