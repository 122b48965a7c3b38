"""Marin 8B Instruct: the model card's SFT recipe (one phase, 5.3B tokens of chat data).

    ./bazelw run //levanter:train -- --config=levanter/configs/marin_8b_instruct.py --dry_run \
        --dry_run_devices=64 --dry_run_hbm_gib=32

plans it on the hardware Marin used, a TPU v4-128 slice (64 chips, 32 GiB of HBM each), without
the data or the base model present. The recipe: Marin 8B Base (Llama 3 8B shapes, the Llama 3
tokenizer's 128,256 ids) fine-tuned on eight chat datasets as mixture components weighted by
their document counts (dolphin-r1 as its reasoning and non-reasoning halves, as Marin's
`exp808_sft_mixture.py` does), 128 rows of 4,096 tokens a step, 10,109 steps = 5.30B tokens,
loss on the assistant's tokens only.

To train it for real, put each set's JSONL/Parquet conversations (`messages` rows) under
`DATA/<component>/` (or point a component at a bucket:
`--config.data.components.smoltalk.source=chat:gs://BUCKET/smoltalk/*.jsonl.gz`), and give the
tokenizer and the base model:

    --config.data.tokenizer=/path/to/marin-tokenizer/tokenizer.json --config.data.chat_template= \
    --config.model.init_from_hf=/path/to/marin-8b-base    # or checkpoint.init_from=RUN_DIR

(`data.chat_template=` empty: the tokenizer's own template; until then `sft_data/llama3.jinja`,
the Llama 3 chat format with `{% generation %}` marks, stands in for it, and the byte tokenizer
for the tokenizer, whose 259 ids the dry run replaces by the preset's 128,256.)
"""

import pathlib

from meltemi.levanter.config import base_config, mixture_component, with_variant

HERE = pathlib.Path(__file__).parent
DATA = "sft_data/marin"  # relative to the directory the command starts from
# Documents per set (Marin's mixture weights are these counts, normalised).
DOCUMENTS = {
    "tulu_3_sft_mixture": 939_343,  # allenai/tulu-3-sft-mixture
    "smoltalk": 1_043_917,  # HuggingFaceTB/smoltalk
    "openthoughts_114k_math": 89_120,  # open-r1/OpenThoughts-114k-math
    "acecode_89k": 87_149,  # TIGER-Lab/AceCode-89K
    "bespoke_stratos_17k": 16_710,  # bespokelabs/Bespoke-Stratos-17k
    "dolphin_r1_reasoning": 585_418,  # cognitivecomputations/dolphin-r1
    "dolphin_r1_nonreasoning": 214_318,  # cognitivecomputations/dolphin-r1
    "natural_reasoning": 1_145_824,  # facebook/natural_reasoning
    "verifiable_math_problems": 777_457,  # PrimeIntellect/verifiable-math-problems
}
SEQ_LEN, BATCH = 4096, 128
TOKENS = 5.3e9
STEPS = round(TOKENS / (SEQ_LEN * BATCH))  # 10,109

# The same recipe on a tiny model, every component reading the shipped chat set.
_SMOKE_DATA = f"chat:{HERE / 'sft_data' / 'train.jsonl'}"
VARIANTS = {
    "smoke": {
        "name": "marin-8b-instruct-smoke",
        "model.preset": "tiny-llama",
        "trainer.num_train_steps": 2,
        "trainer.train_batch_size": 4,
        "trainer.progress_bar": False,
        "trainer.compute_dtype": "float32",
        "data.seq_len": 256,  # a Llama 3 header costs ~70 bytes
        "eval.num_batches": 1,
        "eval.batch_size": 4,
        "checkpoint.save_every_steps": 1,
        "checkpoint.keep_every_steps": 0,
        **{f"data.components.{name}.source": _SMOKE_DATA for name in DOCUMENTS},
    },
}


def get_config(variant=None):
    config = base_config()
    config.name = "marin-8b-instruct"
    config.model.preset = "marin-8b"
    config.model.remat = "full"
    config.data.seq_len = SEQ_LEN
    config.data.source = "mixture"
    total = sum(DOCUMENTS.values())
    for name, count in DOCUMENTS.items():
        config.data.components[name] = mixture_component(f"chat:{DATA}/{name}", count / total)
    config.data.chat_template = str(HERE / "sft_data" / "llama3.jinja")
    config.data.train_on = "assistant"
    config.data.overlong = "truncate"
    config.trainer.train_batch_size = BATCH
    config.trainer.num_train_steps = STEPS
    config.trainer.compute_dtype = "bfloat16"
    config.mesh.ici.data = 1
    config.mesh.ici.fsdp = -1
    config.optimizer.learning_rate = 5e-6
    config.optimizer.lr_schedule = "linear"
    config.optimizer.warmup = 0.03
    config.optimizer.decay = 0.97  # linear warmup, then linear decay to 0
    config.optimizer.min_lr_ratio = 0.0
    config.optimizer.weight_decay = 0.0
    config.eval.every_steps = 1000
    config.checkpoint.save_every_minutes = 30.0
    config.checkpoint.save_every_steps = 0
    config.checkpoint.keep_every_steps = 2000
    return with_variant(config, variant, VARIANTS)
