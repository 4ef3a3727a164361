"""Scores from a trained reward model (a sequence classifier with one output, as TRL's
RewardTrainer saves it): used by the `reward_model` stage's held-out evaluation and by the GRPO
reward `reward_model` (R1 stage 4 / Qwen3 stage 4: model-scored RL).

`scope: full` scores the whole response, thinking included (R1: harmlessness); `scope: answer`
scores only the part after `</think>` (R1: helpfulness is judged on the final summary). A response
whose thinking never closed, or whose tags are out of order, has no answer, and scores None under
`answer` scope.
"""

from __future__ import annotations

import json
from pathlib import Path

from toolkit.core.loading import whole_model
from toolkit.core.text import answer_region


def load_reward_model(model_dir: str, device: str | None = None, trust_remote_code: bool = False):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    with whole_model():  # each rank scores with its own whole copy
        model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1, dtype=torch.float32,
                                                                   trust_remote_code=trust_remote_code)
    model.config.pad_token_id = tokenizer.pad_token_id
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device).eval(), tokenizer


SCOPE_FILE = "posttrain_reward_model.json"  # beside a trained reward model: {"scope": "answer" | "full"}


def trained_scope(model_dir: str) -> str | None:
    """The scope a posttrain-trained reward model learned on; None for other models."""
    path = Path(model_dir) / SCOPE_FILE
    return json.loads(path.read_text())["scope"] if path.exists() else None


def scoped(response: str, scope: str) -> str | None:
    """The view of a response the reward model judges. The answer view is the text after the one
    closed thinking block (the whole text without thinking tags); None when the thinking is unclosed
    or its tags are out of order: read past a stray `</think>`, qwen3's demo reward model paid 0.145
    more for an answer repeated after one, on 47 of 47 such /no_think answers (RESULTS.md)."""
    if scope == "full":
        return response
    answer = answer_region(response, after_think=None)
    return answer.strip() if answer is not None else None


def score(model, tokenizer, prompts: list[list[dict]], responses: list[str], scope: str = "full",
          batch_size: int = 16, max_length: int = 1024) -> list[float | None]:
    """One scalar per (prompt, response); None where the scope leaves nothing to score."""
    import torch

    texts, index = [], []
    for i, (prompt, response) in enumerate(zip(prompts, responses)):
        part = scoped(response, scope)
        if part is None:
            continue
        messages = [*prompt, {"role": "assistant", "content": part}]
        texts.append(tokenizer.apply_chat_template(messages, tokenize=False))
        index.append(i)
    out: list[float | None] = [None] * len(responses)
    for start in range(0, len(texts), batch_size):
        batch = tokenizer(texts[start:start + batch_size], return_tensors="pt", padding=True, truncation=True,
                          max_length=max_length, add_special_tokens=False).to(model.device)
        with torch.no_grad():
            logits = model(**batch).logits[:, 0].float().tolist()
        for i, value in zip(index[start:start + batch_size], logits):
            out[i] = value
    return out
