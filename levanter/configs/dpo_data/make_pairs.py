"""Writes the small preference set of `levanter/configs/dpo.py` (deterministic: run it, get the
same files).

    python levanter/configs/dpo_data/make_pairs.py

The prompts are `sft_data`'s spelling requests (`spell: kalo`); the chosen reply spells the
asked word with hyphens (`k-a-l-o`), the rejected reply spells another made-up word of the
same length in the same format (`b-i-t-u`). Both replies are in the format SFT taught, so the
SFT model has no reason to prefer either (it learned the format, not the letters: 0% correct
spellings); preferring the chosen reply means reading the word from the prompt. The held-out
split asks for words the training split never saw.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import random

HERE = pathlib.Path(__file__).parent
TRAIN, VALIDATION = 600, 64


def _chat_set():
    path = HERE.parent / "sft_data" / "make_chat_set.py"
    spec = importlib.util.spec_from_file_location("meltemi_make_chat_set", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pair(rng: random.Random, word: str, other: str, chat) -> dict:
    """One row: a spelling request, the right spelling (chosen), another word's (rejected)."""
    prompt = [{"role": "system", "content": chat._SYSTEM}] if rng.random() < 0.3 else []
    prompt.append({"role": "user", "content": rng.choice(chat._ASKS).format(w=word)})
    return {
        "prompt": prompt,
        "chosen": [{"role": "assistant", "content": chat.spell(word)}],
        "rejected": [{"role": "assistant", "content": chat.spell(other)}],
    }


def make(seed: int = 1) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows); held-out words never occur in the training rows."""
    chat = _chat_set()
    rng = random.Random(seed)
    vocabulary = sorted({chat._word(rng) for _ in range(3000)})
    rng.shuffle(vocabulary)
    held_out, seen = vocabulary[:VALIDATION], vocabulary[VALIDATION:]

    def other(word: str, pool: list[str]) -> str:
        same = [w for w in pool if len(w) == len(word) and w != word]
        return rng.choice(same)

    train = [pair(rng, w, other(w, seen), chat) for w in rng.choices(seen, k=TRAIN)]
    validation = [pair(rng, w, other(w, held_out), chat) for w in held_out]
    return train, validation


def main() -> None:
    train, validation = make()
    for name, rows in (("train", train), ("validation", validation)):
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        (HERE / f"{name}.jsonl").write_text(text, encoding="utf-8")
        print(f"{name}.jsonl: {len(rows)} pairs")


if __name__ == "__main__":
    main()
