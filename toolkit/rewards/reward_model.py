"""`reward_model`: model-scored RL (DeepSeek-R1 stage 4, Qwen3 stage 4). A trained reward model
(a `reward_model` stage's output, named in a recipe as `params: {model: rm.model}`) scores each
completion; `scope: answer` scores only the text after `</think>` (R1: helpfulness on the summary),
`scope: full` the whole response with its thinking (R1: harmlessness). Combine it with rule rewards
by weight in the stage's `rewards`.

The model is loaded lazily on the first call, on the rollout's device, and dropped when the reward
is pickled (TRL's rollout workers pickle reward functions), so validation never loads it. Scores
are raw reward-model logits, not clipped: their scale is the reward model's. Counters: `scored`,
`unscored` (answer scope with no answer to read: the thinking unclosed or its tags out of order;
such a response gets the lower of 0 and the batch's lowest score) and `score_ms` (time spent
scoring), from which the stage reports completions scored per second.
"""

from __future__ import annotations

import time

from toolkit.rewards.base import Reward, completion_text
from toolkit.rewards.model_scored import load_reward_model, score, trained_scope


class RewardModelScore(Reward):
    name = "reward_model"

    def __init__(self, model: str | None = None, scope: str = "full", batch_size: int = 16, max_length: int = 1024):
        super().__init__("scored", "unscored", "score_ms")
        if not model:
            raise ValueError("needs `model`: a reward_model stage's output (`rm.model`) or a directory")
        if scope not in ("answer", "full"):
            raise ValueError(f"scope must be answer or full, not {scope!r}")
        self.model_dir, self.scope, self.batch_size, self.max_length = model, scope, batch_size, max_length
        self.__name__ = f"reward_model_{scope}"
        self._loaded = None

    def __getstate__(self):
        return {**self.__dict__, "_loaded": None}

    def __call__(self, prompts=None, completions=(), **_) -> list[float | None]:
        if self._loaded is None:
            if (trained := trained_scope(self.model_dir)) not in (None, self.scope):
                raise ValueError(f"reward_model: {self.model_dir} was trained on the {trained!r} view of responses; "
                                 f"scoring the {self.scope!r} view would judge text unlike any it learned from")
            self._loaded = load_reward_model(self.model_dir)
        model, tokenizer = self._loaded
        started = time.perf_counter()
        messages = [p if isinstance(p, list) else [{"role": "user", "content": str(p)}] for p in prompts]
        values = score(model, tokenizer, messages, [completion_text(c) for c in completions], self.scope,
                       self.batch_size, self.max_length)
        self.counters["score_ms"] += int(1000 * (time.perf_counter() - started))
        self.counters["scored"] += sum(v is not None for v in values)
        self.counters["unscored"] += sum(v is None for v in values)
        # No answer to read (thinking unclosed, tags out of order): the lower of 0 and the batch's
        # lowest score. None would add nothing to the summed reward, which pays a broken layout more
        # than an answer a reward model scores below 0.
        unread = min([0.0, *(v for v in values if v is not None)])
        return [unread if v is None else v for v in values]
