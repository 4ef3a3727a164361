"""Thinking modes (Qwen3 stage 3): the /think and /no_think flags, the response layouts, and the
stop-thinking string a thinking budget inserts.

Layouts, byte for byte as in the Qwen3 report (RECIPES.md):
    thinking      <think>\\n{thinking}\\n</think>\\n\\n{response}
    non-thinking  <think>\\n\\n</think>\\n\\n{response}
Qwen3's template and data put flags at the end of a user turn or of the system message; users type
them anywhere, so a flag is recognised anywhere in the turn as a word of its own (`/no_think what is
2+2?`), the last one in the turn winning; thinking is the default, and in a multi-turn conversation
the LAST flag governs. Earlier assistant turns keep only their response. Templates are unchanged:
the flag stays in the text where the user put it.
"""

from __future__ import annotations

import re
from typing import Literal

THINK_FLAG = "/think"
NO_THINK_FLAG = "/no_think"
EMPTY_THINK = "<think>\n\n</think>\n\n"
# The budget's stop-thinking string. The Qwen3 report prints "...directly now.\n</think>.\n\n" (a
# period after the tag, which no chat template produces); Qwen's usage docs drop that period and
# open with a blank line. We use the docs' form: it closes the block exactly as the templates do.
STOP_THINKING = ("\n\nConsidering the limited time by the user, I have to give the solution based on the "
                 "thinking directly now.\n</think>\n\n")

Mode = Literal["think", "no_think"]
FLAG = re.compile(r"(?<!\S)/(no_)?think(?!\S)")  # a word of its own: not /thinking, not a/think


def thinking_response(thinking: str, response: str) -> str:
    return f"<think>\n{thinking}\n</think>\n\n{response}"


RECHECK = "Let me check that again."


def rechecked(thinking: str, times: int) -> str:
    """The thinking followed by `times` re-checks of itself: long thinking with the same answer, the
    padded side of long2short pairs and a long-CoT warm-up's traces on data with short solutions."""
    return "\n".join([thinking, *(f"{RECHECK}\n{thinking}" for _ in range(times))])


def no_thinking_response(response: str) -> str:
    return EMPTY_THINK + response


def response_only(text: str) -> str:
    """What an assistant turn keeps in later history: the text after its thinking block."""
    head, sep, tail = text.partition("</think>")
    return tail.lstrip("\n") if sep and head.lstrip().startswith("<think>") else text


def flag_of(text: str) -> Mode | None:
    """The mode a message's last flag asks for, wherever it stands, or None when it carries none."""
    flags = FLAG.findall(text)  # the `no_` group of each: "no_" or ""
    if not flags:
        return None
    return "no_think" if flags[-1] else "think"


def governing_mode(messages: list[dict]) -> Mode:
    """The mode a conversation asks for: its last flag in a user or system message; think by default."""
    for message in reversed(messages):
        if message["role"] in ("user", "system") and (mode := flag_of(message["content"])):
            return mode
    return "think"


def with_flag(text: str, mode: Mode) -> str:
    return f"{text.rstrip()} {NO_THINK_FLAG if mode == 'no_think' else THINK_FLAG}"


def flag_messages(messages: list[dict], mode: Mode | Literal["default"]) -> list[dict]:
    """A copy of chat messages with the mode's flag appended to the last user turn; `default` adds
    none (the model's default mode, thinking)."""
    out = [dict(m) for m in messages]
    if mode != "default":
        out[-1]["content"] = with_flag(out[-1]["content"], mode)
    return out


def complies(text: str, mode: str, *, cut: bool) -> bool:
    """Whether a completion follows its mode: the empty think block for no_think; for think, an
    opened block with some thinking in it, closed, or left open only when `cut` (the completion ran
    into its token limit: a long thought cut short still obeyed the flag; a short one that stopped
    without closing did not: qwen3's general RL on demo paid `<think>\nThe answer is 15.` in full,
    RESULTS.md). Either way ONE block: a second `<think>` or `</think>` (an empty
    block followed by the reasoning in another) does not comply. Any other mode (`default`,
    unflagged) is judged as think, the default."""
    if text.count("<think>") != 1 or text.count("</think>") > 1:
        return False
    if mode == "no_think":
        return text.startswith(EMPTY_THINK.strip())
    rest = text.removeprefix("<think>")
    if rest == text or not rest.strip() or rest.lstrip().startswith("</think>"):
        return False
    return "</think>" in rest or cut
