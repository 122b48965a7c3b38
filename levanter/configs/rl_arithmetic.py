"""RL with verifiable rewards on this machine: a tiny model on single-digit arithmetic.

    ./bazelw run //levanter:train -- --config=levanter/configs/rl_arithmetic.py:sft
    ./bazelw run //levanter:rl -- --config=levanter/configs/rl_arithmetic.py

`:sft` teaches a 2-layer, 64-wide Llama (byte tokenizer) the answer format, `3+4=7<eos>`,
on the arithmetic environment's training split (`rl_data/`, made by
`rl_data/make_arithmetic_sft.py`; 180 problems, 20 held out). The RL run starts from that
checkpoint and trains GRPO on the same environment with 2 rollout workers (fray local
backend), exact-match reward, 8 prompts x 8 samples a step, generating one step ahead; the
held-out split's exact-match reward (greedy, and of the policy's samples) is logged at the
start and every 10 steps (`evals.jsonl`, `eval/arithmetic/*`). `:rloo` swaps the estimator,
`:smoke` is 2 steps.

Measured (2026-11-26, load 15-20 on 2 cores): the whole RL run takes about 3 minutes, but it
does not yet raise the held-out reward (greedy 0.10 at the start and after 40 steps); see
levanter/README.md, "Reinforcement learning", for the figures.
"""

import pathlib

from meltemi.levanter.config import base_config, rl_section, with_variant

HERE = pathlib.Path(__file__).parent
DATA = HERE / "rl_data"

_TINY = {
    "model.preset": "tiny-llama",
    "model.num_layers": 2,
    "model.hidden_dim": 64,
    "model.intermediate_dim": 128,
    "model.num_heads": 4,
    "model.num_kv_heads": 2,
    "model.head_dim": 16,
}

VARIANTS = {
    # The SFT stage (`//levanter:train`): the answer format from the training split.
    "sft": {
        "name": "rl-arithmetic-sft",
        "checkpoint.init_from": "",
        "data.source": "files",
        "data.train_files": (str(DATA / "arithmetic_train.jsonl"),),
        "data.validation_files": (str(DATA / "arithmetic_test.jsonl"),),
        "data.packing": "whole_documents",
        "trainer.num_train_steps": 150,
        "trainer.train_batch_size": 16,
        "optimizer.learning_rate": 3e-3,
        "optimizer.warmup": 10,
        "eval.every_steps": 50,
        "eval.num_batches": 2,
    },
    "rloo": {"rl.objective": "rloo"},
    # 2 steps from scratch: what tests/test_configs.py trains (with the trainer binary).
    "smoke": {
        "checkpoint.init_from": "",
        "trainer.num_train_steps": 2,
        "checkpoint.save_every_steps": 1,
        "eval.num_batches": 1,
        "rl.eval_prompts": 4,
        "rl.num_workers": 1,
    },
}


def get_config(variant=None):
    config = base_config()
    config.rl = rl_section()
    config.name = "rl-arithmetic"
    for k, v in _TINY.items():
        section, field = k.split(".")
        config[section][field] = v
    config.data.tokenizer = "byte"
    config.data.seq_len = 16
    config.trainer.seed = 0
    config.trainer.num_train_steps = 40
    config.trainer.progress_bar = False
    config.checkpoint.init_from = "runs/rl-arithmetic-sft"
    config.checkpoint.save_every_steps = 10
    config.optimizer.learning_rate = 1e-3
    config.optimizer.warmup = 0
    config.optimizer.weight_decay = 0.0
    config.rl.objective = "grpo"
    config.rl.env = "arithmetic"
    config.rl.max_operand = 9
    config.rl.ops = "+-"
    config.rl.prompts_per_step = 8
    config.rl.samples_per_prompt = 8
    config.rl.max_tokens = 4
    config.rl.num_workers = 2
    config.rl.eval_every_steps = 10
    config.rl.eval_prompts = 20
    config.rl.kv_bytes = 2 << 20
    config.rl.max_seqs = 64
    return with_variant(config, variant, VARIANTS)
