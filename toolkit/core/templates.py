"""Prompt templates: how a row's question becomes the model's input.

`chat` (the default) feeds the row's messages through the model's chat template. `chat_boxed`
does the same with DeepSeek's recommended math instruction appended to the question (from the
DeepSeek-R1 model card, not the paper), for models that do not box their answers unprompted.
`r1_zero` is DeepSeek-R1-Zero's plain-text template (R1 paper v1, Table 1), for RL straight from a
base model. Any other string containing `{prompt}` is a custom plain-text template.
"""

from __future__ import annotations

from toolkit.core.text import question_text

R1_ZERO = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user with "
    "the answer. The reasoning process and answer are enclosed within <think> </think> and <answer> "
    "</answer> tags, respectively, i.e., <think> reasoning process here </think> <answer> answer here "
    "</answer>. User: {prompt}. Assistant:"
)
TEMPLATES = {"r1_zero": R1_ZERO}
BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
CHAT_TEMPLATES = ("chat", "chat_boxed")


def check_template(template: str) -> str | None:
    if template in CHAT_TEMPLATES or template in TEMPLATES or "{prompt}" in template:
        return None
    return (f"unknown template {template!r}: use {', '.join(CHAT_TEMPLATES + tuple(TEMPLATES))}, "
            "or a string containing {prompt}")


def render_prompt(template: str, row: dict) -> list[dict] | str:
    """Chat messages for `chat` / `chat_boxed`; otherwise the filled-in text (no chat template is
    applied to it)."""
    if template == "chat":
        return row["prompt"]
    if template == "chat_boxed":
        return with_instruction(row["prompt"], BOXED_INSTRUCTION, "\n")
    return TEMPLATES.get(template, template).replace("{prompt}", question_text(row))


def with_instruction(messages: list[dict], instruction: str, sep: str = "\n\n") -> list[dict]:
    """A copy of chat messages with `instruction` appended to the last (user) message."""
    out = [dict(m) for m in messages]
    out[-1]["content"] = f"{out[-1]['content']}{sep}{instruction}"
    return out


def uses_answer_tags(template: str) -> bool:
    """Whether the template asks for the answer inside <answer> ... </answer> (R1-Zero's style)."""
    return "<answer>" in TEMPLATES.get(template, template)


def reference_completion(template: str, answer: str | None = None, code: str | None = None) -> str:
    """A correct completion laid out as the template asks: thinking in <think>, then the answer in
    <answer> tags (R1-Zero style) or boxed (chat templates), or a fenced code block. Validation
    scores it with a stage's rewards to prove the stage can earn them."""
    tags = uses_answer_tags(template)
    if code is not None:
        body = f"```python\n{code}\n```"
    else:
        body = answer if tags else f"The answer is $\\boxed{{{answer}}}$."
    return "<think>\nLet me work it out step by step.\n</think>\n" + (f"<answer> {body} </answer>" if tags else f"\n{body}")
