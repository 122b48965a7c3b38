"""Chat generation against `transformers` on the same Hugging Face export.

A tiny random model (Llama, Qwen3) saved with `hf.save` beside a locally trained byte-level BPE
tokenizer whose tokenizer_config.json carries a ChatML chat template, and a
generation_config.json with an eos list. `transformers` renders each conversation with
`AutoTokenizer.apply_chat_template(add_generation_prompt=True)` and decodes greedily with
`AutoModelForCausalLM.generate(do_sample=False)`; `meltemi.models.chat` must produce the same
prompt ids and the same new tokens, stopping at the same eos.
"""

import json

import chat_testing as C
import hf_harness as H
import pytest
import torch

from meltemi.models import chat

CONVERSATIONS = [
    [{"role": "user", "content": "Hello! How are you today?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is the capital of Greece?"},
    ],
    [
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": "I am fine, thank you."},
        {"role": "user", "content": "Καλημέρα κόσμε, τι κάνεις; 🌊"},
    ],
]
MAX_NEW = 24


def _hf_chat(directory, messages, max_new_tokens):
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(directory)
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
    model = H.load_hf(directory)
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
        )  # eos ids: the export's generation_config.json
    return ids, out[0, len(ids) :].tolist()


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3"])
def test_greedy_chat_equals_transformers(preset, tmp_path):
    directory = C.write_checkpoint(tmp_path / "ckpt", preset, seed=4)
    # Make one conversation stop early on an eos id of the list: the model is random, so take
    # the 4th token transformers generates for it without stopping and add it to the list.
    _, free = _hf_chat(directory, CONVERSATIONS[2], MAX_NEW)
    gen_path = directory / "generation_config.json"
    gen = json.loads(gen_path.read_text())
    eos = [*gen["eos_token_id"], free[3]]
    gen_path.write_text(json.dumps(gen | {"eos_token_id": eos}))

    ours = chat.Chat.from_directory(directory)
    assert ours.eos_token_ids == tuple(eos)
    stopped = 0
    for messages in CONVERSATIONS:
        ids, ref = _hf_chat(directory, messages, MAX_NEW)
        assert ours.prompt_ids(messages) == ids
        got = list(ours.stream(messages, max_new_tokens=MAX_NEW))
        assert got == ref, messages
        stopped += len(ref) < MAX_NEW
        if len(ref) < MAX_NEW:
            assert ref[-1] in eos and not set(ref[:-1]) & set(eos)
    assert stopped >= 1  # at least one conversation ended on an eos id, not at the budget
