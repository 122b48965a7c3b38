"""On-policy distillation lowers the student's reverse KL to the teacher on held-out prompts:
a teacher of the student's architecture (a run directory), one of another size (`rl.teacher` a
Hugging Face export), and the refusals of a teacher whose vocabulary or tokenizer differs."""

import _rl
import equinox as eqx
import jax
import numpy as np
import pytest

import meltemi.data as md
import meltemi.models as mm
from meltemi.levanter.config import ConfigError, load_config, resolve
from meltemi.levanter.rl import RLTrainer
from meltemi.levanter.trainer import Trainer


def test_distillation_lowers_the_reverse_kl_to_the_teacher(tmp_path):
    teacher = _rl.sft(tmp_path / "teacher", steps=60)  # the SFT model of rl_arithmetic.py
    spec, rl = _rl.rl_specs(
        tmp_path / "student", checkpoint__init_from="", rl__objective="distill",
        rl__teacher=teacher, trainer__num_train_steps=12, optimizer__learning_rate=3e-3,
        rl__backend="inprocess", rl__num_workers=1, rl__eval_prompts=20,
    )  # fmt: skip
    result = RLTrainer(spec, rl).run()
    start, end = result.evals[0]["reverse_kl"], result.evals[12]["reverse_kl"]
    print(f"held-out reverse KL(student || teacher) per token: {start:.3f} -> {end:.3f}")
    assert end < 0.9 * start, (start, end)  # measured 3.891 -> 2.460 (2026-11-27)


# Wider and deeper than rl_arithmetic.py's 2-layer, 64-wide student; other head sizes.
TEACHER = [("model.num_layers", "3"), ("model.hidden_dim", "96"),
           ("model.intermediate_dim", "192"), ("model.num_heads", "4"),
           ("model.num_kv_heads", "4"), ("model.head_dim", "24")]  # fmt: skip


def _export_teacher(root, steps):
    """The SFT stage of rl_arithmetic.py on the teacher's model, exported for Hugging Face."""
    overrides = [("run_dir", str(root / "run")), ("trainer.progress_bar", "False"),
                 ("trainer.num_train_steps", str(steps)), ("checkpoint.enabled", "false"),
                 ("eval.every_steps", "0"), *TEACHER]  # fmt: skip
    trainer = Trainer(resolve(load_config(f"{_rl.CONFIG}:sft", overrides)))
    trainer.run()
    trainer.export_hf(root / "hf")
    return root / "hf"


def test_distillation_from_a_larger_hugging_face_teacher(tmp_path):
    teacher = _export_teacher(tmp_path / "teacher", steps=60)
    student, _ = _rl.rl_specs(tmp_path / "probe", checkpoint__init_from="")
    hf_model, hf_config = mm.hf.load(teacher)
    assert (hf_config.num_layers, hf_config.hidden_dim) == (3, 96)
    assert (student.model.num_layers, student.model.hidden_dim) == (2, 64)
    spec, rl = _rl.rl_specs(
        tmp_path / "student", checkpoint__init_from="", rl__objective="distill",
        rl__teacher=teacher, trainer__num_train_steps=12, optimizer__learning_rate=3e-3,
        rl__backend="inprocess", rl__num_workers=1, rl__eval_prompts=20,
    )  # fmt: skip
    trainer = RLTrainer(spec, rl)
    result = trainer.run()
    start, end = result.evals[0]["reverse_kl"], result.evals[12]["reverse_kl"]
    print(f"held-out reverse KL(student || 3x96 teacher) per token: {start:.3f} -> {end:.3f}")
    assert end < 0.9 * start, (start, end)
    # The loss scored the samples with the teacher's own structure and weights.
    tokens = np.asarray([[256, *md.ByteTokenizer().encode("12+34=46")]], np.int32)
    ours = trainer._teacher_static
    assert ours is not None and ours.config.hidden_dim == 96
    rebuilt = eqx.combine(eqx.partition(hf_model, eqx.is_array)[0], ours)
    np.testing.assert_allclose(
        np.asarray(rebuilt(tokens).array), np.asarray(hf_model(tokens).array), atol=1e-6
    )


def _tiny_hf(directory, vocab_size, tokenizer=None):
    config = mm.get_preset("tiny-llama").replace(vocab_size=vocab_size, num_layers=1)
    model = mm.init(config, key=jax.random.key(0))
    mm.hf.save(model, config, directory)
    if tokenizer is not None:
        tokenizer(directory)
    return directory


def test_a_teacher_of_another_vocabulary_is_refused(tmp_path):
    teacher = _tiny_hf(tmp_path / "t", vocab_size=300)
    spec, rl = _rl.rl_specs(tmp_path / "s", checkpoint__init_from="", rl__objective="distill",
                            rl__teacher=teacher, rl__backend="inprocess")  # fmt: skip
    with pytest.raises(ConfigError, match=r"rl.teacher=.*its vocabulary has 300 tokens, the "
                       r"student's 259.*the student's tokenizer \(data.tokenizer\)"):  # fmt: skip
        RLTrainer(spec, rl).run()


def test_a_teacher_of_another_tokenizer_is_refused(tmp_path):
    def other_bpe(directory):  # merges: not the byte mapping
        md.train_bpe(["12+34=46 the quick brown fox"] * 40, 262, directory / "tokenizer.json")

    teacher = _tiny_hf(tmp_path / "t", vocab_size=259, tokenizer=other_bpe)  # the model's 259
    spec, rl = _rl.rl_specs(tmp_path / "s", checkpoint__init_from="", rl__objective="distill",
                            rl__teacher=teacher, rl__backend="inprocess")  # fmt: skip
    with pytest.raises(ConfigError, match=r"rl.teacher=.*tokenizer.json encodes text "
                       r"differently from the student's data.tokenizer='byte'"):  # fmt: skip
        RLTrainer(spec, rl).run()
