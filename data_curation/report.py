"""What every curation step writes, as a stage or from `posttrain curate`: kept.jsonl, removed.jsonl
(each removed row with its reason and evidence), report.json (counts per reason), a table of
examples per reason, and a histogram of pass rates where they were measured."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

from toolkit.core.files import save_figure, write_json_atomic

EXAMPLES_PER_REASON = 5


class EverythingRemoved(RuntimeError):
    """A filter removed every row; training on nothing is never what was meant."""


def write_jsonl(path: Path, rows: list[dict]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def write_outputs(out_dir: Path, step: str, kept: list[dict], removed: list[dict],
                  extra: dict | None = None, pass_rates: list[float] | None = None) -> dict:
    """Write the outputs and return the report; raise EverythingRemoved when nothing is kept.
    `removed` rows carry `removed_reason` and `evidence`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = Counter(r["removed_reason"] for r in removed)
    report = {"step": step, "rows_in": len(kept) + len(removed), "rows_out": len(kept),
              "removed": dict(sorted(counts.items())), **(extra or {})}
    write_jsonl(out_dir / "removed.jsonl", removed)
    examples = {reason: [r for r in removed if r["removed_reason"] == reason][:EXAMPLES_PER_REASON] for reason in counts}
    write_json_atomic(out_dir / "removed_examples.json", examples)
    if pass_rates:
        plot_pass_rates(pass_rates, out_dir / "pass_rates.png", step)
    write_json_atomic(out_dir / "report.json", report)
    if not kept:
        raise EverythingRemoved(f"{step} removed every row ({report['rows_in']} in, 0 out; by reason: "
                                f"{report['removed']}); refusing to hand an empty dataset to the next stage")
    write_jsonl(out_dir / "kept.jsonl", kept)
    return report


def report_metrics(report: dict) -> dict[str, float]:
    out = {"curate/rows_in": float(report["rows_in"]), "curate/rows_out": float(report["rows_out"])}
    out.update({f"curate/removed/{k}": float(v) for k, v in report["removed"].items()})
    out.update({f"curate/{k}": float(v) for k, v in report.items() if isinstance(v, (int, float))
                and k not in ("rows_in", "rows_out")})
    return out


def examples_table(examples: dict[str, list[dict]]) -> dict[str, list] | None:
    """Columns for an MLflow table: reason, id, question, evidence."""
    rows = [(reason, r["id"], r["prompt"][-1]["content"][:300], json.dumps(r.get("evidence"), ensure_ascii=False)[:300])
            for reason, rs in examples.items() for r in rs]
    if not rows:
        return None
    return {k: [row[i] for row in rows] for i, k in enumerate(("reason", "id", "question", "evidence"))}


def plot_pass_rates(rates: list[float], path: Path, step: str) -> None:
    plot_histogram(rates, path, "pass rate", "prompts", f"{step}: measured pass rates", [i / 10 for i in range(11)])


def plot_histogram(values: list[float], path: Path, xlabel: str, ylabel: str, title: str, bins=20) -> None:
    """A histogram PNG, written to a temporary name and renamed into place."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.hist(values, bins=bins, edgecolor="black")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    save_figure(fig, path)
