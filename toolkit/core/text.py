"""Text helpers every layer shares: where a completion's thinking ends and its answer begins, where
its final answer is, and which question a row asks."""

from __future__ import annotations

import re

THINK_THEN_ANSWER = re.compile(r"^\s*<think>(.*?)</think>\s*(\S.*)$", re.DOTALL)
THINK_AND_ANSWER_TAGS = re.compile(r"^\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*$", re.DOTALL)


def split_thinking(text: str) -> tuple[str | None, str]:
    """(thinking, answer) of a completion; thinking is None when there is no well-formed block."""
    m = THINK_THEN_ANSWER.match(text)
    if not m or text.count("<think>") != 1 or text.count("</think>") != 1:
        return None, text
    return m.group(1).strip(), m.group(2).strip()


def is_well_formed(text: str, answer_tags: bool = False) -> bool:
    if text.count("<think>") != 1 or text.count("</think>") != 1:
        return False
    if answer_tags:
        m = THINK_AND_ANSWER_TAGS.match(text)
        return bool(m and m.group(2).strip() and text.count("<answer>") == 1)
    return split_thinking(text)[0] is not None


ANSWER_IS = re.compile(r"answer is[:\s]*\$?([^\n$]+?)\$?\s*\.?\s*$", re.IGNORECASE | re.MULTILINE)
ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)

def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}), braces matched, or None."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, j = 1, i
    while j < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        j += 1
    return text[i:j - 1] if depth == 0 else None


def extract_answer(text: str, answer_is_fallback: bool = True) -> str | None:
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    if answer_is_fallback:
        matches = ANSWER_IS.findall(text)
        if matches:
            return matches[-1].strip()
    return None


def one_closed_thinking(text: str) -> bool:
    """Exactly one `</think>`, at most one `<think>`, and that one before it: a second thinking
    block, or tags out of order, is not the template's layout (the `<think>` may sit in the prompt)."""
    if text.count("</think>") != 1 or text.count("<think>") > 1:
        return False
    opened = text.find("<think>")
    return opened < text.find("</think>")


def answer_region(text: str, answer_tags: bool = False, after_think: bool | None = False) -> str | None:
    """The part of a completion the answer is read from; None when the template's place for it is
    missing or ambiguous (with after_think or answer_tags: not exactly one closed thinking block,
    see `one_closed_thinking`; with answer_tags: no `<answer>` block after it). `after_think=None`
    (held-out evaluation, and the rewards that judge an answer in any template: instruction
    constraints, code, a reward model's answer view): after the thinking when the completion has
    thinking tags, else anywhere, so a model that never thinks is read whole and one that does is
    never read inside its thinking, nor past a stray second `</think>`."""
    if after_think is None:
        after_think = "<think>" in text or "</think>" in text
    if after_think or answer_tags:
        if not one_closed_thinking(text):
            return None
        text = text.split("</think>", 1)[1]
    if answer_tags:
        blocks = ANSWER_TAG.findall(text)
        return blocks[-1] if blocks else None
    return text


def question_text(row: dict) -> str:
    """The user's question: the text filters, decontamination, splits and templates look at."""
    return row["prompt"][-1]["content"]
