"""Preference optimisation (DPO) after SFT: the SFT model learns which reply to prefer.

    ./bazelw run //levanter:train -- --config=levanter/configs/default.py   # pretrain
    ./bazelw run //levanter:train -- --config=levanter/configs/sft.py       # then SFT
    ./bazelw run //levanter:train -- --config=levanter/configs/dpo.py       # then DPO

starts from the newest checkpoint of the SFT run (`runs/sft`), which is also the frozen
reference model, and trains on the small preference set shipped beside this file (`dpo_data/`:
600 pairs in which the chosen reply spells the asked word, `spell: kalo` -> `k-a-l-o`, and the
rejected reply spells another word of the same length in the same format; made by
`dpo_data/make_pairs.py` so that every pair fits one 128-token row: none is dropped). The 64
held-out pairs (words never seen in training) are evaluated as `eval/validation/*`:
`rewards/accuracies` is the share of pairs whose implied reward `beta * (log pi - log ref)`
prefers the chosen reply, `logps/accuracies` the share the policy itself gives more
probability to; `--config.eval.at_start=true` also evaluates the SFT model before the first
step (logged as step 0).

Other objectives and references are overrides: `--config.trainer.objective=ipo` (or `simpo`,
reference-free, with `trainer.beta=2.0`), `--config.trainer.reference=precomputed` (the
reference's log-probs computed once before training), `--config.model.lora.rank=8` (the
reference is then the base model without adapters, with no second copy).

`:short` is 60 steps (after a shortened pretraining and SFT, as tutorial 07 runs them);
`:smoke` trains 2 steps of a tiny model from scratch (`tests/test_configs.py`,
`tests/test_dpo.py`).
"""

import pathlib

from meltemi.levanter.config import sibling_config, smoke_variant, with_variant

PAIRS = pathlib.Path(__file__).parent / "dpo_data"

VARIANTS = {
    # 60 steps after a shortened pretraining and SFT.
    "short": {
        "name": "dpo-short",
        "trainer.num_train_steps": 60,
        "eval.every_steps": 0,
    },
    # Two steps of a tiny model from scratch (its own start is the reference).
    "smoke": smoke_variant("dpo-smoke", {"checkpoint.init_from": "", "eval.every_steps": 0}),
}


def get_config(variant=None):
    # The same model and template as the SFT run: the warm start matches every array.
    config = sibling_config(__file__, "sft.py")
    config.name = "dpo"
    config.checkpoint.init_from = "runs/sft"  # its newest checkpoint: policy and reference
    config.data.train_files = (str(PAIRS / "train.jsonl"),)
    config.data.validation_files = (str(PAIRS / "validation.jsonl"),)
    config.data.overlong = "drop"  # a pair is never cut
    config.trainer.objective = "dpo"
    config.trainer.beta = 0.1
    config.trainer.reference = "live"
    config.trainer.num_train_steps = 150
    config.optimizer.learning_rate = 5e-4  # the schedule and the evaluation are sft.py's
    config.checkpoint.save_every_steps = 50
    return with_variant(config, variant, VARIANTS)
