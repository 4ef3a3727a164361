"""`ifeval_synthetic`: instruction-following prompts with machine-checkable constraints, generated
offline. Each row's `answer` is the JSON constraint list the `ifeval_constraints` reward checks
(word-count bounds, required keywords, JSON output, all lowercase, bullet count, response
language, closing phrase), and its `solution` is a reference response that satisfies all of them
(checked as each row is made). Difficulty = number of constraints.

With `thinking=True` the solution is long-CoT shaped, as synthetic_math's: a written plan inside
<think>...</think> (each constraint restated, the facts chosen, the result checked against every
constraint), then the same reference response. Ours: it gives thinking-mode SFT (qwen3's fusion)
instruction rows whose think block is short and closed; the constraints judge only the response.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

from data_curation.schema import make_row
from data_curation.sources.splits import in_split
from toolkit.core.thinking import thinking_response
from toolkit.rewards.ifeval import check_constraints

NAME = "ifeval_synthetic"
VERIFIERS = ("ifeval",)  # what its rows are judged by (recipe validation reasons with it)
TOPICS = {  # topic -> facts a reference answer is made of
    "tea": ["Tea is made by steeping leaves in hot water.", "Green tea is not oxidised.",
            "Black tea is fully oxidised.", "Many people drink tea in the morning."],
    "bicycles": ["A bicycle turns leg power into motion.", "Gears make hills easier to climb.",
                 "A helmet protects the rider.", "Bicycles need little parking space."],
    "volcanoes": ["A volcano is an opening in the crust.", "Magma that reaches the surface is lava.",
                  "Some volcanoes are dormant for centuries.", "Ash clouds can stop air travel."],
    "sleep": ["Adults need about eight hours of sleep.", "A dark room helps you fall asleep.",
              "Screens late at night delay sleep.", "Sleep helps memory."],
    "gardening": ["Plants need light, water and soil.", "Compost feeds the soil.",
                  "Water early in the day.", "Weeds compete with plants for water."],
    "the moon": ["The moon orbits the earth.", "It causes the tides.", "Its phases repeat every month.",
                 "People first walked on it in 1969."],
    "bread": ["Bread is made from flour, water and yeast.", "Yeast makes the dough rise.",
              "Kneading builds gluten.", "Fresh bread keeps for a few days."],
    "rivers": ["Rivers flow from high ground to the sea.", "They carry sediment.",
               "Many cities grew along rivers.", "Dams store river water."],
}
TASKS = ["Write a short explanation of {topic}.", "Tell a curious student about {topic}.",
         "Summarise the key facts about {topic}.", "Give a brief overview of {topic}."]
CLOSINGS = ["That is all.", "I hope this helps.", "Thank you for reading."]


def _build(r: random.Random, topic: str) -> tuple[str, str, list[dict], list[str]]:
    facts = TOPICS[topic]
    layout = r.choice(["plain", "bullets", "json"])
    k = r.randint(2, len(facts))
    chosen = facts[:k]
    lowercase = r.random() < 0.3
    closing = r.choice(CLOSINGS) if layout != "json" and r.random() < 0.3 else None
    if layout == "bullets":
        response = "\n".join(f"- {f}" for f in chosen)
    elif layout == "json":
        response = json.dumps({"topic": topic, "facts": chosen})
    else:
        response = " ".join(chosen)
    if closing:
        response += ("\n" if layout == "bullets" else " ") + closing
    if lowercase:
        response = response.lower()
    words = [w.strip(".,\"[]{}:").lower() for w in " ".join(chosen).split()]
    keywords = sorted({w for w in words if len(w) > 4}, key=words.index)[:r.randint(1, 2)]
    constraints, asks = [], []
    if layout == "bullets":
        constraints.append({"type": "bullets", "count": k})
        asks.append(f"Use exactly {k} bullet points, each starting with '- '.")
    if layout == "json":
        constraints.append({"type": "json"})
        asks.append("Format your entire answer as valid JSON.")
    if lowercase:
        constraints.append({"type": "lowercase"})
        asks.append("Write everything in lowercase letters.")
    if closing:
        constraints.append({"type": "ends_with", "text": closing.lower() if lowercase else closing})
        asks.append(f"End your answer with the phrase \"{closing.lower() if lowercase else closing}\".")
    if keywords and r.random() < 0.6:
        constraints.append({"type": "keywords", "words": keywords})
        asks.append("Include the word" + ("s " if len(keywords) > 1 else " ") + " and ".join(keywords) + ".")
    n_words = len(response.split())
    if r.random() < 0.5 or not constraints:
        lo, hi = max(1, (n_words * 7 // 10) // 5 * 5), (n_words * 13 // 10) // 5 * 5 + 5
        constraints.append({"type": "word_count", "min": lo, "max": hi})
        asks.append(f"Answer in {lo} to {hi} words.")
    if r.random() < 0.3:
        constraints.append({"type": "language", "language": "en"})
        asks.append("Respond in English.")
    question = r.choice(TASKS).format(topic=topic) + " " + " ".join(asks)
    return question, response, constraints, chosen


def _plan(topic: str, constraints: list[dict], facts: list[str], response: str) -> str:
    """The thinking of a `thinking=True` row: what is asked, what is used, and the check."""
    said = {"bullets": lambda c: f"exactly {c['count']} bullet points starting with '- ', one fact each",
            "json": lambda c: "the whole answer as one JSON object with the topic and the facts",
            "lowercase": lambda c: "every letter in lowercase",
            "ends_with": lambda c: f"the last words \"{c['text']}\"",
            "keywords": lambda c: "the word" + ("s " if len(c["words"]) > 1 else " ") + " and ".join(c["words"]),
            "word_count": lambda c: f"{c['min']} to {c['max']} words",
            "language": lambda c: "English only"}
    asked = "; ".join(said[c["type"]](c) for c in constraints)
    words = len(response.split())
    return (f"The question is about {topic}. It asks for: {asked}.\n"
            f"Facts to use ({len(facts)}): " + " ".join(facts) + "\n"
            f"Check: {words} words, and " + ("the requirement above is met." if len(constraints) == 1 else
                                             f"each of the {len(constraints)} requirements above is met."))


def param_problems(thinking=False, **_) -> list[tuple[str, str]]:
    """(parameter, message) for values `rows` would misread; recipe validation asks before any compute."""
    return [] if isinstance(thinking, bool) else [("thinking", f"thinking must be true or false, not {thinking!r}")]


def rows(split: str = "train", n: int | None = 200, seed: int = 0, eval_share: float = 0.2,
         thinking: bool = False) -> Iterator[dict]:

    n = 200 if n is None else n
    made, index, seen = 0, 0, set()
    while made < n and index < 50 * n + 1000:
        r = random.Random(f"{NAME}:{index}")  # the item at an index never depends on the seed...
        index += 1
        topic = sorted(TOPICS)[r.randrange(len(TOPICS))]
        question, response, constraints, facts = _build(r, topic)
        if question in seen or not in_split(question, split, seed, eval_share):  # ...only its split does
            continue
        seen.add(question)
        assert check_constraints(response, constraints) == 1.0, (question, response)
        solution = thinking_response(_plan(topic, constraints, facts, response), response) if thinking else response
        yield make_row(id=f"{NAME}/{split}/{seed}/{made}", question=question, answer=json.dumps(constraints),
                       verifier="ifeval", solution=solution, source=NAME, difficulty=len(constraints))
        made += 1
