"""The default run: a small Llama trained on the Python standard library, on the CPU.

./bazelw run //levanter:train -- --config=levanter/configs/default.py
./bazelw run //levanter:train -- --config=levanter/configs/default.py:smoke
"""

from meltemi.levanter.config import base_config, with_variant

VARIANTS = {
    # Two steps of a tiny model: what the config's test runs.
    "smoke": {
        "trainer.num_train_steps": 2,
        "trainer.train_batch_size": 4,
        "trainer.progress_bar": False,
        "eval.num_batches": 1,
        "eval.batch_size": 4,
        "data.seq_len": 32,
        "data.max_documents": 64,
        "checkpoint.save_every_steps": 1,
    },
    # The same run as two slices (one process each) joined over loopback.
    "multislice": {"mesh.num_slices": 2},
}


def get_config(variant=None):
    config = base_config()
    config.name = "default"
    config.trainer.num_train_steps = 300
    config.trainer.train_batch_size = 16
    config.data.seq_len = 128
    config.eval.every_steps = 100
    config.checkpoint.save_every_steps = 100
    return with_variant(config, variant, VARIANTS)
