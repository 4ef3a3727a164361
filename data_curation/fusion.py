"""Thinking-mode fusion data (Qwen3 stage 3): one SFT set that teaches a model both modes.

- Thinking rows (rejection-sampled from the RL model): a `think_flag_share` of them carry `/think`,
  the rest no flag, because thinking is the default. Response layout `<think>\\n{thinking}\\n</think>\\n\\n{response}`.
- Non-thinking rows: always `/no_think`; response `<think>\\n\\n</think>\\n\\n{response}`, where the
  response is the row's solution with any thinking removed.
- A `system_flag_share` of the flagged single-turn rows carry the flag at the end of a system
  message instead of the user turn.
- A `multi_turn_share` of the rows are preceded by an earlier exchange (another row's question with
  the OPPOSITE flag, and that row's response only: thinking never enters the history). The final
  turn then always carries its own flag, and it is the last flag that governs.
- Ours, a departure (`cut_thinking_share`, 0 = the report's data): that share of the thinking rows
  is added once more with its thinking cut after a random word and closed by the stop-thinking
  string, then the same response: what a thinking budget does at inference. The report says
  answering from a cut thought "emerges naturally" from fusion; at 135M parameters it did not (qwen3
  demo: budget 16 below budget 0, the model thinking on after the string). The cut thought and the
  string are the row's `no_loss_prefix`: the budget inserts the string, the model must not learn to.
  With `cut_answer="working"` (also ours) the answer first writes out the equations the cut thought had
  not finished, from the line the cut fell in: with the response alone after a cut mid-sum, SmolLM2
  guessed the answer or thought on, garbled, and closed a second block (budget 16 below budget 0 in
  every qwen3 demo run); Qwen3's own answers after thinking restate the solution's steps.
- Ours too (`hard_switch_share`, 0 = the report's data): that share of the non-thinking rows is added
  once more WITHOUT a flag, the empty think block as its `no_loss_prefix`: the layout of the chat
  template's hard switch (`enable_thinking=False` renders the empty block into the prompt), which a
  thinking budget of 0 uses. In the report's data every empty block follows /no_think, and at 135M the
  model learnt the flag, not the block: under the hard switch it worked the sum out after the empty
  block and closed a second one (197 of 200 training-split prompts, qwen3's tenth demo run).
Every built row is checked against `governing_mode` before it is written; a mismatch is a bug and
raises. The shares actually produced are returned for the report.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from typing import Literal

from toolkit.core.text import split_thinking
from toolkit.core.thinking import (
    EMPTY_THINK,
    STOP_THINKING,
    Mode,
    flag_of,
    governing_mode,
    no_thinking_response,
    response_only,
    thinking_response,
    with_flag,
)

SYSTEM_PROMPT = "You are a helpful assistant."
NO_LOSS_PREFIX = "no_loss_prefix"  # a row's completion opening that SFT trains without loss


CutAnswer = Literal["response", "working"]


def working_left(thinking: str, cut_at: int) -> str:
    """The thought's equation lines (those holding `=`) from the line the cut at `cut_at` fell in to the
    end: the computation a thought cut there had not finished, written out once more."""
    line_start = thinking.rfind("\n", 0, cut_at) + 1
    return "\n".join(line.strip() for line in thinking[line_start:].splitlines() if "=" in line)


def cut_thought(thinking: str, response: str, rng: random.Random, stop_thinking: str = STOP_THINKING,
                answer: CutAnswer = "response") -> tuple[str, str]:
    """(completion, its no-loss prefix): the thinking cut after a random word (at least one, never
    all) and closed by the stop-thinking string, as a budget leaves it, then the response; with
    `answer="working"`, the response preceded by `working_left` (none left: the response alone)."""
    words = list(re.finditer(r"\S+", thinking))
    cut_at = words[rng.randrange(1, len(words)) - 1].end()
    prefix = f"<think>\n{thinking[:cut_at]}{stop_thinking}"
    working = working_left(thinking, cut_at) if answer == "working" else ""
    return prefix + (f"{working}\n\n" if working else "") + response, prefix


def _single_turn(row: dict, flag: Mode | None, in_system: bool) -> list[dict]:
    messages = [dict(m) for m in row["prompt"] if m["role"] != "system"]
    if flag is None:
        return messages
    if in_system:
        return [{"role": "system", "content": with_flag(SYSTEM_PROMPT, flag)}, *messages]
    messages[-1]["content"] = with_flag(messages[-1]["content"], flag)
    return messages


def build_fusion(thinking_rows: list[dict], plain_rows: list[dict], think_flag_share: float = 0.5,
                 system_flag_share: float = 0.1, multi_turn_share: float = 0.2, seed: int = 0,
                 cut_thinking_share: float = 0.0, stop_thinking: str = STOP_THINKING,
                 hard_switch_share: float = 0.0, cut_answer: CutAnswer = "response") -> tuple[list[dict], list[dict], dict]:
    """(fusion rows, removed rows, composition). Thinking rows whose solution has no non-empty
    think block are removed (`no_thinking`); plain rows need a non-empty response (`no_response`)."""
    # the added rows draw from their own generators: with none added, the report's rows as before
    rng, cut_rng, switch_rng = random.Random(seed), random.Random(seed + 1_000_003), random.Random(seed + 2_000_003)
    removed, think_items, plain_items = [], [], []
    no_loss: dict[str, str] = {}  # an added row's id -> its no-loss prefix
    cuts, switched = set(), set()  # the ids of cut-thought rows and of hard-switch rows
    for row in thinking_rows:
        thinking, response = split_thinking(row.get("solution") or "")
        if not thinking:
            removed.append({**row, "removed_reason": "no_thinking", "evidence": (row.get("solution") or "")[:120]})
            continue
        think_items.append((row, "think", thinking_response(thinking, response)))
        if cut_thinking_share and len(thinking.split()) > 1 and cut_rng.random() < cut_thinking_share:
            completion, no_loss[f"{row['id']}#cut"] = cut_thought(thinking, response, cut_rng, stop_thinking, cut_answer)
            cuts.add(f"{row['id']}#cut")
            think_items.append(({**row, "id": f"{row['id']}#cut"}, "think", completion))
    for row in plain_rows:
        response = response_only(row.get("solution") or "").strip()
        if not response:
            removed.append({**row, "removed_reason": "no_response", "evidence": (row.get("solution") or "")[:120]})
        else:
            plain_items.append((row, "no_think", no_thinking_response(response)))
            if hard_switch_share and switch_rng.random() < hard_switch_share:
                switched.add(f"{row['id']}#switch")
                no_loss[f"{row['id']}#switch"] = EMPTY_THINK
                plain_items.append(({**row, "id": f"{row['id']}#switch"}, "no_think", no_thinking_response(response)))
    items = think_items + plain_items
    rng.shuffle(items)
    counts: Counter = Counter()
    out = []
    for i, (row, mode, completion) in enumerate(items):
        switch = row["id"] in switched  # single-turn and unflagged: the template's switch sets the mode
        multi = not switch and rng.random() < multi_turn_share and len(items) > 1
        flag: Mode | None = None if switch else mode
        if mode == "think" and not multi and rng.random() >= think_flag_share:
            flag = None  # thinking is the default
        in_system = not multi and flag is not None and rng.random() < system_flag_share
        if multi:
            j = rng.randrange(len(items) - 1)
            earlier, _, earlier_completion = items[j + (j >= i)]  # any other row
            other: Mode = "think" if mode == "no_think" else "no_think"
            prompt = [*_single_turn(earlier, other, False),
                      {"role": "assistant", "content": response_only(earlier_completion)},
                      *_single_turn(row, mode, False)]
        else:
            prompt = _single_turn(row, flag, in_system)
        if switch and any(flag_of(m["content"]) for m in prompt):
            raise AssertionError(f"fusion row {row['id']} is a hard-switch row but carries a flag")
        if not switch and governing_mode(prompt) != mode:
            raise AssertionError(f"fusion row {row['id']} asks for {governing_mode(prompt)} but answers in {mode}")
        counts[mode] += 1
        counts["multi_turn"] += multi
        counts["system_flag"] += in_system
        counts["think_unflagged"] += flag is None and not switch
        counts["think_cut"] += row["id"] in cuts
        counts["no_think_switch"] += switch
        built = {**row, "id": f"{row['id']}#{mode}", "prompt": prompt, "solution": completion, "mode": mode}
        out.append({**built, NO_LOSS_PREFIX: no_loss[row["id"]]} if row["id"] in no_loss else built)
    total = max(1, len(out))
    kinds = ("think", "no_think", "think_unflagged", "multi_turn", "system_flag", "think_cut", "no_think_switch")
    composition = {"rows": len(out), **{k: counts[k] for k in kinds},
                   **{f"share_{k}": counts[k] / total for k in kinds}}
    return out, removed, composition
