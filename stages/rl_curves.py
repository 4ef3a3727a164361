"""What an RL stage's log history says at a glance: first-fifth vs last-fifth means, and a plot per
step of the reward with each of its components, accuracy, completion length, KL to the reference
and the clipped share of tokens (logged to the stage's MLflow run as rl_curves.png)."""

from __future__ import annotations

from pathlib import Path

from toolkit.core.files import save_figure

CURVES = {"reward": "reward", "accuracy": "accuracy", "length": "completions/mean_length", "kl": "kl",
          "clip fraction": "clip_ratio/region_mean"}
COMPONENT = ("rewards/", "/mean")  # TRL's per-reward-function means: drawn on the reward panel


def series(log_history: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one logged key. Steps where it is None are left out: TRL logs None for a
    reward that judged no row of the batch (a verifier-scoped accuracy on a batch of chat prompts)."""
    points = [(h["step"], float(h[key])) for h in log_history if h.get(key) is not None and "step" in h]
    return [s for s, _ in points], [v for _, v in points]


def fifths(values: list[float]) -> tuple[float, float] | None:
    """Means of the first and the last fifth of a curve (at least one point each)."""
    if len(values) < 2:
        return None
    k = max(1, len(values) // 5)
    return sum(values[:k]) / k, sum(values[-k:]) / k


def curve_metrics(log_history: list[dict]) -> dict[str, float]:
    out = {}
    for name, key in CURVES.items():
        if (f := fifths(series(log_history, key)[1])) is not None:
            out[f"train/{name.replace(' ', '_')}_first_fifth"], out[f"train/{name.replace(' ', '_')}_last_fifth"] = f
    return out


def plot_curves(log_history: list[dict], path: Path) -> bool:
    """Write the curves as a PNG; False when there is nothing to plot."""
    present = {name: series(log_history, key) for name, key in CURVES.items()}
    present = {name: xy for name, xy in present.items() if xy[0]}
    if not present:
        return False
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    components = sorted({k for h in log_history for k in h if k.startswith(COMPONENT[0]) and k.endswith(COMPONENT[1])})
    fig, axes = plt.subplots(1, len(present), figsize=(4.5 * len(present), 3.2), squeeze=False)
    for ax, (name, (steps, values)) in zip(axes[0], present.items()):
        ax.plot(steps, values, marker=".", linewidth=1.5, label="total" if name == "reward" else None)
        if name == "reward" and components:
            for key in components:
                ax.plot(*series(log_history, key), linewidth=1, alpha=0.8,
                        label=key.removeprefix(COMPONENT[0]).removesuffix(COMPONENT[1]))
            ax.legend(fontsize=7)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    save_figure(fig, path)
    return True
