"""Writes the small preference set of `levanter/configs/dpo.py` (deterministic: run it, get the
same files).

    python levanter/configs/dpo_data/make_pairs.py

The prompts are `sft_data`'s spelling requests (`spell: kalo`); the chosen reply spells the
asked word with hyphens (`k-a-l-o`), the rejected reply spells another made-up word of the
same length in the same format (`b-i-t-u`). Both replies are in the format SFT taught;
preferring the chosen one means reading the word from the prompt. The SFT model of tutorial 07
spells none of the held-out words right greedily, yet by log-prob it already prefers the chosen
reply in about 90% of the held-out pairs (it learned to copy letters); DPO moves the margin
against that reference. The held-out split asks for words the training split never saw.

Every pair fits one `dpo.py` row (`ROW` = 128 tokens of the byte tokenizer, both
conversations rendered with `sft_data/template.jinja`), so the trainer drops none: a row holds
the prompt twice (once per reply), so the prompts carry no system message, and a request
whose pair would not fit (the longest request with the longest words) is asked another way.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import random

HERE = pathlib.Path(__file__).parent
TRAIN, VALIDATION = 600, 64
ROW = 128  # dpo.py's data.seq_len


def _chat_set():
    path = HERE.parent / "sft_data" / "make_chat_set.py"
    spec = importlib.util.spec_from_file_location("meltemi_make_chat_set", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tokens(prompt: list[dict], reply: str) -> int:
    """Byte-tokenizer tokens of one conversation as `sft_data/template.jinja` renders it:
    `<|role|>\ncontent\n` per prompt turn, then `<|assistant|>\n` reply `<eos>` `\n`."""
    turns = sum(len(f"<|{m['role']}|>\n{m['content']}\n".encode()) for m in prompt)
    return turns + len(b"<|assistant|>\n") + len(reply.encode()) + 2


def pair(rng: random.Random, word: str, other: str, chat) -> dict:
    """One row: a spelling request, the right spelling (chosen), another word's (rejected)."""
    chosen, rejected = chat.spell(word), chat.spell(other)
    asks = [a for a in chat._ASKS if _fits(a.format(w=word), chosen, rejected)]
    prompt = [{"role": "user", "content": rng.choice(asks).format(w=word)}]
    return {
        "prompt": prompt,
        "chosen": [{"role": "assistant", "content": chosen}],
        "rejected": [{"role": "assistant", "content": rejected}],
    }


def _fits(ask: str, chosen: str, rejected: str) -> bool:
    prompt = [{"role": "user", "content": ask}]
    return tokens(prompt, chosen) + tokens(prompt, rejected) <= ROW


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
