"""Long-context extension: Marin 8B from its 4k pretraining context to 64k (`:128k`: 128k).

    ./bazelw run //levanter:train -- --config=levanter/configs/long_context.py --dry_run \
        --dry_run_devices=32
    ./bazelw run //levanter:train -- --config=levanter/configs/long_context.py:no_split \
        --dry_run --dry_run_devices=8

plan one step on a TPU v5p-64 (32 chips): FSDP over 8 devices times a `sequence` split over
the rest (4; ring attention), so each device holds a quarter of every 64k row. `:no_split`
is the same run without the split: the same 8-way FSDP and rows per device, on the 8 devices
one sequence group would use. `:128k` is FSDP 4 times the rest (8 on a v5p-64).

The recipe (as Llama 3 and Qwen extend their context): start from the base model
(`model.init_from_hf` or `checkpoint.init_from`), scale RoPE by config (YaRN with factor
16 over the original 4,096 positions; `:llama3` uses Llama 3's scaling instead), train on
long rows of packed documents (the standard library's modules streamed into 64k rows:
segment ids keep documents apart, positions restart per document) with a short warmup and
a cosine decay at a low learning rate. `:smoke` is the same recipe with a tiny model and
256-token rows: what the config's tests train (on 8 CPU devices it splits the sequence 8
ways; on one device it does not split).
"""

from meltemi.levanter.config import base_config, smoke_variant, with_variant

_YARN_128K = {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096}

VARIANTS = {
    # 128k tokens per row: YaRN factor 32, the sequence split 8 ways, one row per FSDP group.
    "128k": {
        "name": "long-context-128k",
        "trainer.train_batch_size": 4,
        "data.seq_len": 131_072,
        "model.max_seq_len": 131_072,
        "model.rope_scaling": _YARN_128K,
        "mesh.ici.fsdp": 4,
    },
    # The same runs without the split (8-way FSDP, one row per device).
    "no_split": {
        "name": "long-context-no-split",
        "model.sequence_parallel": "none",
        "mesh.ici.sequence": 1,
    },
    "128k_no_split": {
        "name": "long-context-128k-no-split",
        "trainer.train_batch_size": 4,
        "data.seq_len": 131_072,
        "model.max_seq_len": 131_072,
        "model.rope_scaling": _YARN_128K,
        "model.sequence_parallel": "none",
        "mesh.ici.fsdp": 4,
        "mesh.ici.sequence": 1,
    },
    # 8xH100 (--dry_run_devices=8): FSDP 2 x sequence 4.
    "h100": {"name": "long-context-h100", "mesh.ici.fsdp": 2, "trainer.train_batch_size": 2},
    # Llama 3's rope scaling (factor 16 from 4k) instead of YaRN.
    "llama3": {
        "name": "long-context-llama3",
        "model.rope_scaling": {
            "rope_type": "llama3",
            "factor": 16.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 4096,
        },
    },
    # The recipe at CPU size: a tiny model, 256-token rows (YaRN from 32 positions).
    "smoke": smoke_variant(
        "long-context-smoke",
        {
            "model.preset": "tiny-llama",
            "model.max_seq_len": 256,
            "model.remat": "none",
            "model.rope_scaling": {
                "rope_type": "yarn",
                "factor": 8.0,
                "original_max_position_embeddings": 32,
            },
            "data.seq_len": 256,
            "mesh.ici.fsdp": 1,
            "mesh.ici.data": 1,
            "mesh.ici.sequence": -1,
            "trainer.train_batch_size": 2,
            "trainer.compute_dtype": "float32",
            "eval.batch_size": 2,
            "checkpoint.keep_every_steps": 0,
        },
    ),
}


def get_config(variant=None):
    config = base_config()
    config.name = "long-context"
    config.model.preset = "marin-8b"
    config.model.max_seq_len = 65_536
    config.model.rope_scaling = {
        "rope_type": "yarn",
        "factor": 16.0,
        "original_max_position_embeddings": 4096,
    }
    config.model.sequence_parallel = "ring"
    config.model.remat = "full"
    config.data.seq_len = 65_536
    config.trainer.train_batch_size = 8
    config.trainer.num_train_steps = 1000
    config.trainer.compute_dtype = "bfloat16"
    config.mesh.ici.data = 1
    config.mesh.ici.fsdp = 8
    config.mesh.ici.sequence = -1  # the rest of the slice: 4 of a v5p-64's 32 chips
    config.optimizer.learning_rate = 3e-5
    config.optimizer.lr_schedule = "cosine"
    config.optimizer.warmup = 0.03
    config.optimizer.min_lr_ratio = 0.1
    config.optimizer.weight_decay = 0.1
    config.eval.every_steps = 200
    config.checkpoint.save_every_minutes = 30.0
    return with_variant(config, variant, VARIANTS)
