"""Supervised fine-tuning on chat data: the default run's model learns to answer in a format.

    ./bazelw run //levanter:train -- --config=levanter/configs/default.py   # pretrain first
    ./bazelw run //levanter:train -- --config=levanter/configs/sft.py

starts from the newest checkpoint of the default run (`runs/default`: the 0.85M-parameter
Llama pretrained on the standard library, byte tokenizer) and fine-tunes it on the small chat
set shipped beside this file (`sft_data/`: 400 conversations in which the assistant spells a
word with hyphens, `spell: kalo` -> `k-a-l-o`, made by `sft_data/make_chat_set.py`). The
conversations are rendered with `sft_data/template.jinja`, only the assistant's tokens carry
loss, conversations are packed whole into rows, and the held-out split (48 conversations on
words the training split never saw) is evaluated as `eval/validation`.

`:short` is the pair `tests/test_sft.py` runs (fewer steps, after a shortened pretraining);
`:smoke` trains 2 steps of a tiny model from scratch (`tests/test_configs.py`).
"""

import pathlib

from meltemi.levanter.config import sibling_config, smoke_variant, with_variant

CHAT = pathlib.Path(__file__).parent / "sft_data"

VARIANTS = {
    # What tests/test_sft.py trains after a 40-step pretraining of default.py.
    "short": {
        "name": "sft-short",
        "trainer.num_train_steps": 50,
        "eval.every_steps": 0,
        "eval.num_batches": 2,
    },
    # Two steps of a tiny model from scratch: what the config's test runs.
    "smoke": smoke_variant("sft-smoke", {"checkpoint.init_from": "", "eval.every_steps": 0}),
}


def get_config(variant=None):
    config = sibling_config(__file__, "default.py")  # the same model: the warm start fits
    config.name = "sft"
    config.checkpoint.init_from = "runs/default"  # its newest checkpoint
    config.data.source = "chat"
    config.data.train_files = (str(CHAT / "train.jsonl"),)
    config.data.validation_files = (str(CHAT / "validation.jsonl"),)
    config.data.chat_template = str(CHAT / "template.jinja")
    config.data.train_on = "assistant"
    config.data.overlong = "truncate"  # a long two-question chat keeps its first answer
    config.trainer.num_train_steps = 200
    config.trainer.train_batch_size = 16
    config.optimizer.learning_rate = 1e-3
    config.optimizer.lr_schedule = "linear"
    config.optimizer.warmup = 0.1
    config.optimizer.decay = 0.5
    config.optimizer.min_lr_ratio = 0.1
    config.optimizer.weight_decay = 0.0
    config.eval.every_steps = 50
    config.eval.num_batches = 4
    config.eval.batch_size = 16
    config.checkpoint.save_every_steps = 100
    return with_variant(config, variant, VARIANTS)
