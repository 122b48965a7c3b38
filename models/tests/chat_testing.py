"""Tiny chat checkpoints for the chat tests: a random model saved with `hf.save` beside a
byte-level BPE tokenizer trained here (ChatML specials) whose tokenizer_config.json holds a
ChatML chat template, and a generation_config.json with an eos list. Nothing is downloaded."""

from __future__ import annotations

import json
import pathlib

import model_testing as T
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import meltemi.models as mm
from meltemi.models import hf

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB = 331  # odd, and above the 256 bytes + 3 specials: 72 merges

# Qwen's ChatML layout: a default system turn when the conversation has none.
CHATML = (
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

CORPUS = [
    "You are a helpful assistant.",
    "Hello! How are you today? I am fine, thank you.",
    "What is the capital of Greece? Athens is the capital of Greece.",
    "Καλημέρα κόσμε, τι κάνεις; Ο μελτέμης φυσάει το καλοκαίρι.",
    "system user assistant",
] * 20


def write_tokenizer(directory: pathlib.Path, *, template: str | None = CHATML) -> dict[str, int]:
    """A byte-level BPE `tokenizer.json` + `tokenizer_config.json` in `directory`; returns the
    special tokens' ids."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 256,
    }
    if template is not None:
        config["chat_template"] = template
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return {s: tok.token_to_id(s) for s in SPECIALS}


def write_checkpoint(
    directory: pathlib.Path,
    preset: str = "tiny-llama",
    *,
    seed: int = 0,
    template: str | None = CHATML,
    eos: list[str | int] | None = None,
) -> pathlib.Path:
    """A tiny random `preset` model with a chat tokenizer, saved with `hf.save`.

    `generation_config.json`'s eos list is `eos` (token strings or ids; default: `<|im_end|>`
    and `<|endoftext|>`)."""
    tok_dir = directory.parent / (directory.name + "_tokenizer")
    ids = write_tokenizer(tok_dir, template=template)
    eos = ["<|im_end|>", "<|endoftext|>"] if eos is None else eos
    eos_ids = tuple(ids[e] if isinstance(e, str) else e for e in eos)
    cfg = mm.get_preset(preset).replace(
        vocab_size=VOCAB, max_seq_len=256, eos_token_id=eos_ids, bos_token_id=None
    )
    hf.save(T.random_model(cfg, seed=seed), cfg, directory, tokenizer=tok_dir)
    gen = json.loads((directory / "generation_config.json").read_text())
    assert gen["eos_token_id"] == list(eos_ids), gen
    return directory


def page_bytes(config: mm.ModelConfig, page_size: int) -> int:
    """Bytes of one KV page of `config` in float32 (keys and values of every layer)."""
    return 2 * config.num_layers * page_size * config.num_kv_heads * config.head_size * 4


def serve(checkpoint: pathlib.Path, engine, model_name: str):
    """Yields (url, runner) of the checkpoint served on a free 127.0.0.1 port (a fixture body)."""
    from meltemi.models.serve import BackgroundServer, load_app

    app, runner = load_app(checkpoint, engine, model_name=model_name)
    with BackgroundServer(app) as url:
        yield url, runner
    runner.stop()


def metrics(url: str) -> dict[str, float]:
    """The server's `/metrics` counters by name."""
    import httpx

    lines = httpx.get(url + "/metrics").text.splitlines()
    return {ln.split()[0]: float(ln.split()[1]) for ln in lines if ln and ln[0] != "#"}
