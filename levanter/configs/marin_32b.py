"""Marin 32B (Llama 3 shapes; `:qk` is the Qwen3 QK-norm variant): plan it before renting it.

    ./bazelw run //levanter:train -- --config=levanter/configs/marin_32b.py --dry_run \
        --dry_run_devices=256

prints the per-device memory, FLOPs and tokens of one step on 256 devices with FSDP, without
running it. Training it for real needs the hardware: the mesh is FSDP within a slice and data
parallel across slices (set mesh.num_slices and mesh.dcn.data on a multislice pod).
"""

from meltemi.levanter.config import base_config, with_variant

VARIANTS = {
    # Marin switched from Llama to Qwen3 (QK-norm) mid-run: warm start with checkpoint.init_from.
    "qk": {"name": "marin-32b-qk", "model.preset": "marin-32b-qk"},
    # The same recipe on a model small enough for the CPU: what the config's 2-step test runs.
    "smoke": {
        "name": "marin-32b-smoke",
        "trainer.num_train_steps": 2,
        "trainer.train_batch_size": 4,
        "trainer.progress_bar": False,
        "trainer.compute_dtype": "float32",
        "data.seq_len": 32,
        "eval.num_batches": 1,
        "eval.batch_size": 4,
        "model.preset": "tiny-llama",
        "checkpoint.save_every_steps": 1,
        "checkpoint.keep_every_steps": 0,
    },
}


def get_config(variant=None):
    config = base_config()
    config.name = "marin-32b"
    config.model.preset = "marin-32b"
    config.model.remat = "full"
    config.data.seq_len = 4096
    config.trainer.train_batch_size = 1024
    config.trainer.num_train_steps = 160_000
    config.trainer.compute_dtype = "bfloat16"
    config.trainer.z_loss = 1e-4
    config.mesh.ici.data = 1
    config.mesh.ici.fsdp = -1
    config.optimizer.learning_rate = 7e-4
    config.optimizer.lr_schedule = "linear"
    config.optimizer.warmup = 0.01
    config.optimizer.decay = 0.4
    config.optimizer.weight_decay = 0.05
    config.optimizer.adamc = "decay"
    config.optimizer.max_grad_norm = ((0, 1.0), (80_000, 0.2))
    config.optimizer.update_clip_window = 128
    config.optimizer.skip_step_window = 128
    config.optimizer.ema_beta = 0.995
    config.eval.every_steps = 1000
    config.checkpoint.save_every_minutes = 30.0
    config.checkpoint.save_every_steps = 0
    config.checkpoint.keep_every_steps = 10_000
    return with_variant(config, variant, VARIANTS)
