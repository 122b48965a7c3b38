"""GRPO on math word problems at the 8B scale: a plan, checked by `--dry_run`.

    ./bazelw run //levanter:rl -- --config=levanter/configs/rl_math.py --dry_run \
        --dry_run_devices=64 --dry_run_hbm_gib=32

An 8B Llama-3-shaped policy (`marin-8b`, 128,256 ids) trained with GRPO: 64 prompts x 16
samples a step (1,024 sequences of up to 2,048 tokens, 1,536 sampled), rewards from
`math-verify` on `rl.problems`. The trainer holds FSDP over its 64 devices; 8 rollout workers
of 8 devices each sample with the inference engine (paged KV pool of 8 GiB per worker),
one step ahead (stale by at most one version: importance-corrected). With LoRA
(`:lora`, rank 64 on every linear layer) a weight sync sends the adapters alone.

The real run is this file plus `--config.model.init_from_hf=DIR --config.data.tokenizer=
DIR/tokenizer.json --config.rl.problems=PATH`.
"""

from meltemi.levanter.config import base_config, rl_section, smoke_variant, with_variant

PROMPTS, SAMPLES, SEQ_LEN = 64, 16, 2048

VARIANTS = {
    "lora": {"model.lora.rank": 64, "model.lora.alpha": 128.0, "model.lora.targets": "all-linear"},
    # 2 steps of the smoke model (tiny-llama's family): what tests/test_configs.py trains.
    "smoke": smoke_variant(
        "rl-math-smoke",
        {
            "model.preset": "tiny-llama",
            "model.remat": "none",
            "data.seq_len": 32,
            "trainer.microbatches": 1,
            "trainer.compute_dtype": "float32",
            "optimizer.warmup": 0,
            "rl.prompts_per_step": 2,
            "rl.samples_per_prompt": 2,
            "rl.max_tokens": 8,
            "rl.num_workers": 1,
            "rl.worker_devices": 1,
            "rl.kv_bytes": 1 << 20,
            "rl.max_seqs": 8,
            "rl.eval_prompts": 4,
        },
    ),
}


def get_config(variant=None):
    config = base_config()
    config.rl = rl_section()
    config.name = "rl-math-8b"
    config.model.preset = "marin-8b"
    config.model.remat = "full"
    config.data.seq_len = SEQ_LEN
    config.trainer.train_batch_size = PROMPTS * SAMPLES  # the rows of one RL step
    config.trainer.microbatches = 4  # 256 rows of 2,048 tokens at a time
    config.trainer.num_train_steps = 500
    config.trainer.compute_dtype = "bfloat16"
    config.mesh.ici.data = 1
    config.mesh.ici.fsdp = -1
    config.optimizer.learning_rate = 1e-6
    config.optimizer.lr_schedule = "constant"
    config.optimizer.warmup = 10
    config.optimizer.weight_decay = 0.0
    config.checkpoint.save_every_steps = 20
    config.rl.objective = "grpo"
    config.rl.env = "math"
    config.rl.problems = "math_train.jsonl"
    config.rl.prompts_per_step = PROMPTS
    config.rl.samples_per_prompt = SAMPLES
    config.rl.max_tokens = 1536
    config.rl.clip_high = 0.28
    config.rl.kl_beta = 0.0
    config.rl.num_workers = 8
    config.rl.worker_devices = 8
    config.rl.kv_bytes = 8 << 30
    config.rl.max_seqs = 256
    config.rl.steps_ahead = 1
    config.rl.max_staleness = 1
    config.rl.eval_every_steps = 25
    config.rl.eval_prompts = 500
    return with_variant(config, variant, VARIANTS)
