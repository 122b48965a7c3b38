"""The default run: a small Llama trained on the Python standard library, on the CPU.

    ./bazelw run //levanter:train -- --config=levanter/configs/default.py
    ./bazelw run //levanter:train -- --config=levanter/configs/default.py:smoke

Bytes of Python source (byte tokenizer, 259 ids), 128-token sequences, 16 per step; a 4-layer
Llama with 128-wide embeddings (~0.9M parameters); AdamW with a warmup-stable-decay schedule.
"""

from meltemi.levanter.config import base_config, smoke_variant, with_variant

VARIANTS = {
    # Two steps of a tiny model: what the config's test runs.
    "smoke": smoke_variant("default-smoke", {"eval.every_steps": 0, "data.seq_len": 32}),
    # The same run as two slices (one process each) joined over loopback.
    "multislice": {"name": "default-multislice", "mesh.num_slices": 2},
}


def get_config(variant=None):
    config = base_config()
    config.name = "default"
    config.trainer.num_train_steps = 400
    config.trainer.train_batch_size = 16
    config.data.seq_len = 128
    config.model.preset = "tiny-llama"
    config.model.hidden_dim = 128
    config.model.intermediate_dim = 384
    config.model.num_layers = 4
    config.model.num_heads = 4
    config.model.num_kv_heads = 2
    config.model.head_dim = 32
    config.model.remat = "none"
    config.optimizer.learning_rate = 3e-3
    config.optimizer.lr_schedule = "linear"
    config.optimizer.warmup = 0.05
    config.optimizer.decay = 0.4
    config.optimizer.min_lr_ratio = 0.1
    config.optimizer.weight_decay = 0.1
    config.eval.every_steps = 100
    config.eval.num_batches = 8
    config.eval.batch_size = 16
    config.checkpoint.save_every_steps = 100
    return with_variant(config, variant, VARIANTS)
