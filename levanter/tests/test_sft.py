"""Supervised fine-tuning: levanter/configs/sft.py makes the default run's model answer held-out
chat prompts in the trained format.

The default run (cut to 2 layers) is pretrained for 40 steps, then `sft.py:short` (50 steps)
warm-starts from its run directory and fine-tunes on the shipped chat set. Greedy replies to
the 48 held-out prompts (words never seen in training) are in the trained format when the
whole reply is hyphen-spelt letters and it ended at eos (`sft_data/make_chat_set.py FORMAT`);
the rate is measured on the pretrained model and on the fine-tuned one.
"""

import importlib.util
import json
import pathlib

import pytest

from meltemi.levanter.config import load_config, resolve
from meltemi.levanter.evaluation import chat_replies, format_rate, load_model
from meltemi.levanter.trainer import train

CONFIGS = pathlib.Path(__file__).parent.parent / "configs"
CHAT = CONFIGS / "sft_data"


def _chat_set():
    spec = importlib.util.spec_from_file_location("make_chat_set", CHAT / "make_chat_set.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _held_out() -> list[list[dict]]:
    lines = (CHAT / "validation.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["messages"] for line in lines]


def _rate(run_dir: pathlib.Path, spec) -> tuple[float, list]:
    loaded = load_model(str(run_dir))
    replies = chat_replies(
        loaded.model,
        spec.tokenizer,
        spec.data.template,
        _held_out(),
        eos_ids=(spec.tokenizer.eos_id,),
        max_new_tokens=16,
    )
    return format_rate(replies, _chat_set().FORMAT), replies


def test_the_shipped_chat_set_is_what_its_script_makes():
    train_rows, validation_rows = _chat_set().make()
    for name, rows in (("train", train_rows), ("validation", validation_rows)):
        shipped = (CHAT / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()
        assert [json.loads(line) for line in shipped] == rows

    def answers(rows):
        return {m["content"] for r in rows for m in r["messages"] if m["role"] == "assistant"}

    seen, held = answers(train_rows), answers(validation_rows)
    assert not seen & held  # the held-out answers are never trained on


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft")
    # 2 layers (default.py trains 4), as tutorial 07 does: the format is learned as well, in
    # half the time.
    common = [("data.cache_dir", str(root / "cache")), ("trainer.progress_bar", "false"),
              ("model.num_layers", "2")]  # fmt: skip
    pretrain = load_config(
        f"{CONFIGS / 'default.py'}",
        [("run_dir", str(root / "default")), ("trainer.num_train_steps", "40"),
         ("eval.num_batches", "1"), *common],
    )  # fmt: skip
    train(pretrain)
    sft = load_config(
        f"{CONFIGS / 'sft.py'}:short",
        [("run_dir", str(root / "sft")), ("checkpoint.init_from", str(root / "default")),
         *common],
    )  # fmt: skip
    result = train(sft)
    return root, resolve(sft), result


def test_sft_raises_the_held_out_format_rate(runs):
    root, spec, result = runs
    before, _ = _rate(root / "default", spec)
    after, replies = _rate(root / "sft", spec)
    answers = [m[-1]["content"] for m in _held_out()]
    correct = sum(r.text == a for r, a in zip(replies, answers, strict=True)) / len(answers)
    print(f"format rate on 48 held-out prompts: before {before:.3f}, after {after:.3f} "
          f"(spelt right: {correct:.3f})")  # fmt: skip
    print("e.g.", [(r.text, a) for r, a in zip(replies[:4], answers, strict=False)])
    assert before <= 0.1
    assert after >= 0.75, [r.text for r in replies]


def test_sft_starts_from_the_pretrained_run_and_trains_only_the_replies(runs):
    root, spec, result = runs
    warm = (root / "sft" / "warm_start.txt").read_text()
    assert "step_00000040" in warm and "initialised" not in warm
    first, last = result.losses[1], result.losses[max(result.losses)]
    assert last < 0.25 * first  # the replies' tokens only: a format learned quickly
    records = [json.loads(x) for x in (root / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["data/overlong_truncated"] > 0  # two-question chats cut at a turn end
    # Held-out replies (assistant tokens only): the format costs nothing, the letters of an
    # unseen word about 1 nat each; the pretrained model is at ~3 nats a byte on this text.
    assert result.eval["validation"]["loss"] < 1.5
