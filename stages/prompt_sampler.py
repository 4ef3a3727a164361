"""Which prompts each RL step trains on: `random`, `curriculum` or `prioritized` (Kimi k1.5).

The sampler is asked for a batch exactly when the trainer needs one, so prioritized sampling sees
success rates updated by every rollout so far (a DataLoader sampler would be read ahead of
training). Every rank holds the same sampler, fed the same gathered rewards, so all ranks draw the
same global batch. Its state (RNG, position, success table) is plain JSON, saved in each
checkpoint, so a resumed stage continues the same schedule.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

SamplerKind = Literal["random", "curriculum", "prioritized"]


class PromptSampler:
    """Draws prompt indices batch by batch.

    - random: shuffled passes over the data, without replacement within a pass.
    - curriculum: passes ordered easy to hard by `difficulty` (a number per prompt: a difficulty
      label, or 1 - pass rate when measured); ties are shuffled. Each pass restarts from the easy end.
      When the stage will draw fewer prompts than there are (`stage_prompts`, set by `pace`), the
      first pass is one prompt from each of that many equal slices of the easy-to-hard order, so
      the stage still ends on the hard prompts. Unpaced, kimi_k15's demo curriculum drew the
      easiest 24 of its 51 prompts and never the hard end (RESULTS.md, "kimi_k15's curriculum").
    - prioritized: P(i) proportional to 1 - s_i, where s_i is the running success rate of prompt i
      over its rollouts so far (unseen prompts count as 0, so they come first). If every prompt is
      solved, it falls back to uniform. Drawn without replacement within a batch.
    """

    def __init__(self, kind: SamplerKind, n: int, seed: int = 0, difficulty: list[float] | None = None):
        if n < 1:
            raise ValueError("the sampler needs at least one prompt")
        if kind == "curriculum" and (difficulty is None or len(difficulty) != n):
            raise ValueError("curriculum sampling needs one difficulty value per prompt")
        self.kind, self.n = kind, n
        self.difficulty = list(difficulty) if difficulty is not None else None
        self.rng = np.random.default_rng(seed)
        self.order: list[int] = []
        self.pos = 0
        self.passes = 0
        self.stage_prompts: int | None = None
        self.drawn = 0  # prompts handed out so far, to check `pace`'s count against the trainer's draws
        self.attempts = np.zeros(n)
        self.successes = np.zeros(n)

    def _new_pass(self) -> None:
        perm = self.rng.permutation(self.n)
        if self.kind == "curriculum":  # stable sort of a shuffle = by difficulty, ties at random
            perm = perm[np.argsort(np.asarray(self.difficulty)[perm], kind="stable")]
            if self.passes == 0 and self.stage_prompts is not None and self.stage_prompts < self.n:
                perm = np.asarray([self.rng.choice(part) for part in np.array_split(perm, self.stage_prompts)])
        self.order, self.pos = perm.tolist(), 0
        self.passes += 1

    def pace(self, stage_prompts: int) -> None:
        """How many prompts the stage will draw in all (its steps x prompts per step), before the
        first draw. Only the curriculum uses it; see the class docstring."""
        if self.passes:
            raise ValueError("pace the sampler before its first batch")
        self.stage_prompts = max(1, int(stage_prompts))

    def next_batch(self, size: int) -> list[int]:
        self.drawn += size
        if self.kind == "prioritized":
            return self._prioritized(size)
        out: list[int] = []
        while len(out) < size:
            if self.pos >= len(self.order):
                self._new_pass()
            take = self.order[self.pos:self.pos + size - len(out)]
            self.pos += len(take)
            out += take
        return out

    def success_rate(self) -> np.ndarray:
        return np.divide(self.successes, self.attempts, out=np.zeros(self.n), where=self.attempts > 0)

    def _prioritized(self, size: int) -> list[int]:
        weights = 1.0 - self.success_rate()
        if weights.sum() <= 0:
            weights = np.ones(self.n)
        p = weights / weights.sum()
        replace = size > int((weights > 0).sum())
        return self.rng.choice(self.n, size=size, replace=replace, p=p).tolist()

    def update(self, indices: list[int], success: list[float]) -> None:
        """Record rollout outcomes (success in [0, 1], e.g. an accuracy reward) for prompt indices."""
        for i, s in zip(indices, success):
            if s is None or s != s:  # None or NaN: not judged
                continue
            self.attempts[i] += 1
            self.successes[i] += min(max(float(s), 0.0), 1.0)

    def state_dict(self) -> dict:
        return {"kind": self.kind, "n": self.n, "rng": self.rng.bit_generator.state, "order": self.order,
                "pos": self.pos, "passes": self.passes, "stage_prompts": self.stage_prompts, "drawn": self.drawn,
                "attempts": self.attempts.tolist(),
                "successes": self.successes.tolist()}

    def load_state_dict(self, state: dict) -> None:
        if (state["kind"], state["n"]) != (self.kind, self.n):
            raise ValueError(f"sampler state is for {state['kind']} over {state['n']} prompts, "
                             f"not {self.kind} over {self.n}: the stage's data changed since the checkpoint")
        self.rng.bit_generator.state = state["rng"]
        self.order, self.pos, self.passes = list(state["order"]), state["pos"], state["passes"]
        # absent in checkpoints written before pacing: keep `pace`'s count (it only shapes a first pass
        # not yet drawn, and the stage reports it)
        self.stage_prompts = state.get("stage_prompts", self.stage_prompts)
        self.drawn = state.get("drawn", 0)
        self.attempts, self.successes = np.asarray(state["attempts"]), np.asarray(state["successes"])
