"""RL with verifiable rewards on this machine: a tiny model on carry-free two-digit sums.

    ./bazelw run //levanter:train -- --config=levanter/configs/rl_arithmetic.py:sft
    ./bazelw run //levanter:rl -- --config=levanter/configs/rl_arithmetic.py

The environment is `ArithmeticEnv(max_operand=99, ops="+", carries=False)` (`rl.carries`):
additions with no carry, 2,723 training and 302 held-out problems; they are solved column by
column from single-digit facts, so what is learned on training problems holds on held-out ones.
Reward: 1.0 when the response's first line is exactly the sum (`46`), else 0.

`:sft` (800 steps, about a minute) teaches a 2-layer, 64-wide Llama (byte tokenizer) the sums
from the training split (`rl_data/`, made by `rl_data/make_arithmetic_sft.py`), on purpose in
two formats: one answer in three is written `12+34=46`, the other two `12+34=46.0`, which the
exact-match reward refuses. The SFT model so mostly answers `46.0`-style, on held-out prompts
too (its greedy reward there is 0). The RL run starts from that checkpoint and trains GRPO on
the training split only, 16 prompts x 8 samples a step, lr 3e-4, with 2 rollout workers (fray
local backend) generating one step ahead. The reward never shows an answer; the format it
prefers is one choice shared by all prompts, so what RL learns from it carries over to the
held-out prompts. Their exact-match reward (greedy, and of the policy's samples) is logged at
the start and every 10 steps (`evals.jsonl`, `eval/arithmetic/*`). `:rloo` swaps the
estimator, `:test` is the short run of tests/test_rl_rise.py, `:smoke` is 2 steps.

Measured (2026-11-27, 2 cores shared with 4 other jobs, seeds fixed, 100 held-out prompts):
held-out greedy exact match 0.00 at step 0, 0.50 at step 10, 0.66 at 20, 0.68 at 40; sampled
0.154 -> 0.289. The 40 steps take 52 s (the update compiles once, then ~0.1 s a step).

SIGTERM stops the run after the step in progress with a checkpoint (exit status 75); the same
command resumes it.
"""

import pathlib

from meltemi.levanter.config import base_config, rl_section, smoke_variant, with_variant

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
    # The SFT stage (`//levanter:train`): the sums of the training split, two answers in
    # three in the `46.0` format the reward refuses (rl_data/make_arithmetic_sft.py).
    "sft": {
        "name": "rl-arithmetic-sft",
        "checkpoint.init_from": "",
        "data.source": "files",
        "data.train_files": (str(DATA / "arithmetic_train.jsonl"),),
        "data.validation_files": (str(DATA / "arithmetic_test.jsonl"),),
        "data.packing": "whole_documents",
        "trainer.num_train_steps": 800,
        "trainer.train_batch_size": 16,
        "optimizer.learning_rate": 3e-3,
        "optimizer.warmup": 10,
        "eval.every_steps": 50,
        "eval.num_batches": 2,
    },
    "rloo": {"rl.objective": "rloo"},
    # The held-out rise in short (tests/test_rl_rise.py): 18 steps, one in-process worker.
    "test": {
        "trainer.num_train_steps": 18,
        "checkpoint.save_every_steps": 0,
        "rl.backend": "inprocess",
        "rl.num_workers": 1,
        "rl.eval_every_steps": 0,
        "rl.eval_prompts": 64,
    },
    # 2 steps of the smoke model from scratch: what tests/test_configs.py trains.
    "smoke": smoke_variant(
        "rl-arithmetic-smoke",
        {"checkpoint.init_from": "", "rl.eval_prompts": 4, "rl.num_workers": 1},
    ),
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
    config.optimizer.learning_rate = 3e-4
    config.optimizer.warmup = 0
    config.optimizer.weight_decay = 0.0
    config.rl.objective = "grpo"
    config.rl.env = "arithmetic"
    config.rl.max_operand = 99
    config.rl.ops = "+"
    config.rl.carries = False
    config.rl.prompts_per_step = 16
    config.rl.samples_per_prompt = 8
    config.rl.max_tokens = 5
    config.rl.num_workers = 2
    config.rl.eval_every_steps = 10
    config.rl.eval_prompts = 100
    config.rl.kv_bytes = 2 << 20
    config.rl.max_seqs = 64
    return with_variant(config, variant, VARIANTS)
