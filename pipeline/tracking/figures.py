"""The figures posttrain logs to MLflow (matplotlib, imported only when a figure is new): the
held-out metrics of every stage with 95% interval bars, and accuracy against thinking budget."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from pipeline.store.home import home


def figure_file(name: str, data, draw) -> Path:
    """`draw(plt, data)` saved as PNG, once per distinct `data` ($POSTTRAIN_HOME/cache/plots/): a
    rerun whose stages all come from the cache shows the same figures without importing matplotlib."""
    key = hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:24]
    path = home() / "cache" / "plots" / key / name
    if not path.exists():
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig = draw(plt, data)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{name}.{os.getpid()}.tmp.png")
        fig.savefig(tmp)
        plt.close(fig)
        os.replace(tmp, path)
    return path


def draw_bars(plt, bars: list):
    fig, axes = plt.subplots(1, len(bars), figsize=(3.4 * len(bars), 3.4), squeeze=False)
    for ax, (key, shown) in zip(axes[0], bars):
        names = [name for name, *_ in shown]
        values = [value for _, value, *_ in shown]
        # 95% interval bars where the stage measured one (Wilson for rates, bootstrap for means)
        errors = [[v - lo if lo is not None else 0 for (*_, lo, _), v in zip(shown, values)],
                  [hi - v if hi is not None else 0 for (*_, hi), v in zip(shown, values)]]
        ax.bar(names, values, yerr=errors, capsize=3, color="#4C72B0", ecolor="#333333", label="stage (95% interval)")
        inputs = [(name, before) for name, _, before, *_ in shown if before is not None]
        if inputs:
            ax.scatter([n for n, _ in inputs], [v for _, v in inputs], color="#DD8452", zorder=3, label="input model")
        ax.set_title(key.removeprefix("eval/"), fontsize=9)
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("held-out evaluation after each stage (dots: the model it started from)")
    fig.tight_layout()
    return fig


def draw_budget_curves(plt, curves: dict):
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for name, pts in curves.items():
        ax.plot([str(b) for b, _ in pts], [a for _, a in pts], marker="o", label=name)
    ax.set_xlabel("thinking budget (tokens)")
    ax.set_ylabel("accuracy")
    ax.legend(fontsize=7)
    fig.suptitle("accuracy against thinking budget, per stage")
    fig.tight_layout()
    return fig


def budget_points(metrics: dict[str, float]) -> list[tuple[str, float]]:
    """(budget, accuracy) in budget order, `unlimited` last."""
    found = [(k.split("/")[2], v) for k, v in metrics.items() if k.startswith("eval/budget/") and k.endswith("/accuracy")]
    return sorted(found, key=lambda p: (p[0] == "unlimited", int(p[0]) if p[0].isdigit() else 0))
