"""Writes the small chat set of `levanter/configs/sft.py` (deterministic: run it, get the same
files).

    python levanter/configs/sft_data/make_chat_set.py

One learnable format: the user asks for a word to be spelt (several phrasings, sometimes after a
system turn, sometimes a second question in the same conversation) and the assistant answers
with its letters joined by hyphens, nothing else (`spell: kalo` -> `k-a-l-o`). The words are
made-up syllable strings drawn with a fixed seed, so no word list is needed; the held-out split
uses words the training split never saw. `FORMAT` is what "in the trained format" means for
`tests/test_sft.py` and the tutorial: the whole reply matches it (and generation ended at eos).
"""

from __future__ import annotations

import json
import pathlib
import random
import re

FORMAT = re.compile(r"^[a-z](-[a-z])+$")
TRAIN, VALIDATION = 400, 48
_ONSETS = "b c d f g k l m n p r s t v z".split()
_VOWELS = "a e i o u".split()
_ASKS = (
    "spell: {w}",
    "Spell {w}.",
    "How do you spell {w}?",
    "Please spell the word {w}.",
    "Letters of {w}?",
)
_SYSTEM = "You spell words letter by letter."


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(rng.randint(1, 3)))


def spell(word: str) -> str:
    """The trained answer: `spell("kalo") == "k-a-l-o"`."""
    return "-".join(word)


def conversation(rng: random.Random, words: list[str]) -> dict:
    """One row: an optional system turn, then one or two question/answer pairs."""
    messages = [{"role": "system", "content": _SYSTEM}] if rng.random() < 0.3 else []
    for word in words:
        messages.append({"role": "user", "content": rng.choice(_ASKS).format(w=word)})
        messages.append({"role": "assistant", "content": spell(word)})
    return {"messages": messages}


def make(seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows); held-out words never occur in the training rows."""
    rng = random.Random(seed)
    vocabulary = sorted({_word(rng) for _ in range(2000)})
    rng.shuffle(vocabulary)
    held_out, seen = vocabulary[:VALIDATION], vocabulary[VALIDATION:]
    train = []
    for _ in range(TRAIN):
        n = 2 if rng.random() < 0.25 else 1
        train.append(conversation(rng, [rng.choice(seen) for _ in range(n)]))
    validation = [conversation(rng, [w]) for w in held_out]
    return train, validation


def main() -> None:
    here = pathlib.Path(__file__).parent
    train, validation = make()
    for name, rows in (("train", train), ("validation", validation)):
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        (here / f"{name}.jsonl").write_text(text, encoding="utf-8")
        print(f"{name}.jsonl: {len(rows)} conversations")


if __name__ == "__main__":
    main()
