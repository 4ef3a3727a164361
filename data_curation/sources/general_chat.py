"""`general_chat`: everyday, non-reasoning prompts with good short responses: greetings, short
factual answers, rewriting, translation. Written here, no network. Used to mix general data into
SFT (R1's ~200k non-reasoning samples) and as `/no_think` data for thinking-mode fusion.
Verifier: none (no gold answer); the response is the row's `solution`. Difficulty 1.
"""

from __future__ import annotations

from collections.abc import Iterator

from data_curation.schema import make_row
from data_curation.sources.splits import in_split

NAME = "general_chat"
VERIFIERS = ("none",)  # what its rows are judged by (recipe validation reasons with it)
GREETINGS = [
    ("Hi!", "Hello! How can I help you today?"),
    ("Good morning.", "Good morning! What can I do for you?"),
    ("Thanks for your help.", "You're welcome! Let me know if there is anything else."),
    ("How are you?", "I'm doing well, thank you for asking. How can I help?"),
    ("Goodbye!", "Goodbye! Have a great day."),
    ("Can you help me with something?", "Of course. What do you need help with?"),
    ("Who are you?", "I'm an AI assistant. I can answer questions, explain ideas and help with writing."),
    ("Sorry, I made a mistake in my last message.", "No problem at all. What did you mean to say?"),
]
CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Kenya": "Nairobi", "Canada": "Ottawa", "Brazil": "Brasília",
            "Australia": "Canberra", "Egypt": "Cairo", "Germany": "Berlin", "India": "New Delhi",
            "Mexico": "Mexico City", "Norway": "Oslo", "Peru": "Lima", "Spain": "Madrid", "Italy": "Rome",
            "Vietnam": "Hanoi", "Chile": "Santiago", "Ghana": "Accra", "Poland": "Warsaw"}
FACTS = [
    ("How many days are in a leap year?", "A leap year has 366 days."),
    ("What is the boiling point of water at sea level in Celsius?", "Water boils at 100 °C at sea level."),
    ("How many continents are there?", "There are seven continents."),
    ("What gas do plants absorb from the air?", "Plants absorb carbon dioxide."),
    ("Which planet is closest to the sun?", "Mercury is the closest planet to the sun."),
    ("How many minutes are in an hour?", "There are 60 minutes in an hour."),
    ("What is the largest ocean?", "The Pacific Ocean is the largest."),
    ("Who wrote 'Romeo and Juliet'?", "William Shakespeare wrote 'Romeo and Juliet'."),
]
REWRITES = [
    ("gonna be late, traffic is crazy", "I am going to be late because the traffic is very heavy."),
    ("pls send the report asap", "Please send the report as soon as possible."),
    ("the meeting got moved to thursday cuz the boss is out",
     "The meeting has been moved to Thursday because the manager is away."),
    ("cant make it tonight sorry", "I'm sorry, but I can't make it tonight."),
    ("thx for the gift, loved it", "Thank you for the gift; I loved it."),
    ("need the keys back by monday", "I need the keys back by Monday."),
]
PHRASES = {  # English -> French, Spanish, German
    "Good morning": ("Bonjour", "Buenos días", "Guten Morgen"),
    "Thank you very much": ("Merci beaucoup", "Muchas gracias", "Vielen Dank"),
    "Where is the station?": ("Où est la gare ?", "¿Dónde está la estación?", "Wo ist der Bahnhof?"),
    "I would like a coffee": ("Je voudrais un café", "Quisiera un café", "Ich hätte gern einen Kaffee"),
    "See you tomorrow": ("À demain", "Hasta mañana", "Bis morgen"),
}
LANGUAGES = ("French", "Spanish", "German")


def _items() -> list[tuple[str, str, str]]:
    """(kind, question, response), in a fixed order."""
    items = [("greeting", q, a) for q, a in GREETINGS]
    items += [("fact", f"What is the capital of {c}?", f"The capital of {c} is {cap}.") for c, cap in CAPITALS.items()]
    items += [("fact", q, a) for q, a in FACTS]
    items += [("rewrite", f"Rewrite this message in clear, polite English: \"{src}\"", dst) for src, dst in REWRITES]
    items += [("translate", f"Translate into {lang}: \"{en}\"", f"{out[i]}") for en, out in PHRASES.items()
              for i, lang in enumerate(LANGUAGES)]
    return items


def rows(split: str = "all", n: int | None = None, seed: int = 0, eval_share: float = 0.2) -> Iterator[dict]:
    made = 0
    for i, (kind, question, response) in enumerate(_items()):
        if n is not None and made >= n:
            return
        if not in_split(question, split, seed, eval_share):
            continue
        yield make_row(id=f"{NAME}/{kind}/{i}", question=question, answer=None, verifier="none",
                       solution=response, source=NAME, difficulty=1)
        made += 1
