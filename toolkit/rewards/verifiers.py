"""Scoring a row's completion by the row's own verifier (the `verifier` column): what evaluation,
pass-rate filters and rejection sampling use to call a sample right or wrong."""

from __future__ import annotations

from toolkit.rewards import get_reward, reward_counter_metrics

VERIFIER_REWARDS = {"math": "accuracy_math", "code": "code_exec", "ifeval": "ifeval_constraints"}


def score_rows(rows: list[dict], completions: list[str], counters: dict | None = None,
               **math_options) -> list[float | None]:
    """Verifier score per (row, completion), by the row's verifier: math answers by math-verify,
    code by running its tests in the sandbox, instructions by their constraint checks. None where
    the row cannot be judged (verifier "none", or an unparseable gold). `math_options` go to
    `accuracy_math` (e.g. bare_answer=True for no-CoT probes); the verifiers' counters (timeouts,
    errors, sandbox runs) are added to `counters` as `rewards/<name>/<counter>`."""
    scores: list[float | None] = [None] * len(rows)
    for verifier, reward_name in VERIFIER_REWARDS.items():
        idx = [i for i, r in enumerate(rows) if r["verifier"] == verifier]
        if idx:
            reward = get_reward(reward_name, **(math_options if verifier == "math" else {}))
            values = reward(completions=[completions[i] for i in idx], answer=[rows[i]["answer"] for i in idx])
            for i, v in zip(idx, values):
                scores[i] = v
            if counters is not None:
                for key, n in reward_counter_metrics([reward]).items():
                    counters[key] = counters.get(key, 0.0) + n
    return scores
