# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Fine-tune a chat model
#
# Supervised fine-tuning (SFT) turns a base model, which continues text, into a chat model,
# which answers a conversation in a format. Here we pretrain a small byte-level Llama on the
# Python standard library (as `levanter/configs/default.py` does, shortened), then fine-tune
# it with `levanter/configs/sft.py` on the chat set that ships in the repository, and measure
# how many held-out prompts it answers in the trained format, before and after. Nothing is
# downloaded; the notebook takes a few minutes on a 2-core CPU.
#
# Then preference optimisation (DPO, `levanter/configs/dpo.py`) teaches the SFT model which of
# two replies in that format to prefer. From the shell the same three runs are:
#
# ```sh
# ./bazelw run //levanter:train -- --config=levanter/configs/default.py
# ./bazelw run //levanter:train -- --config=levanter/configs/sft.py
# ./bazelw run //levanter:train -- --config=levanter/configs/dpo.py
# ```

# %%
import json
import pathlib

import meltemi.models as mm
from meltemi.data import ByteTokenizer
from meltemi.data.chat import encode_chat
from meltemi.levanter.config import ConfigError, load_config, resolve
from meltemi.levanter.evaluation import chat_replies, format_rate, load_model
from meltemi.levanter.trainer import train

CONFIGS = pathlib.Path(mm.__file__).parents[4] / "levanter" / "configs"
CHAT = CONFIGS / "sft_data"
assert (CHAT / "train.jsonl").exists(), CHAT

# %% [markdown]
# ## The chat data
#
# A chat row is the convention of `transformers` and of every public SFT set: a JSON object
# with `messages`, a list of `{"role", "content"}` turns. Ours: the user asks for a made-up
# word to be spelt, and the assistant answers with its letters joined by hyphens. 400
# training conversations, 48 held out (on words the training split never saw), written by
# `sft_data/make_chat_set.py`.

# %%
rows = [json.loads(line) for line in (CHAT / "train.jsonl").read_text().splitlines()]
held_out = [
    json.loads(line)["messages"] for line in (CHAT / "validation.jsonl").read_text().splitlines()
]
assert len(rows) == 400 and len(held_out) == 48
rows[1]["messages"]

# %% [markdown]
# ## The template and the loss mask
#
# A conversation becomes tokens through a chat template, a Jinja program rendered exactly as
# `transformers`' `apply_chat_template` renders it. A `tokenizer.json` brings its own
# (`tokenizer_config.json`'s `chat_template`); the byte tokenizer has none, so `sft.py` gives
# one with `data.chat_template`. Without it the config stops with one line naming the key:

# %%
SFT = str(CONFIGS / "sft.py")
try:
    resolve(load_config(SFT, [("data.chat_template", "")]))
except ConfigError as e:
    message = str(e)
assert "data.chat_template" in message
message

# %% [markdown]
# With the template, `encode_chat` gives the token ids and the loss mask: 1 on the tokens the
# model is trained to produce. By default those are the assistant's (the template marks them
# with `{% generation %}`), its reply and the `<eos>` that ends it, so the model learns to
# answer and to stop, and is never trained to imitate the user.

# %%
spec = resolve(load_config(SFT))
template, tokenizer = spec.data.template, spec.tokenizer
print(template.render(rows[1]["messages"]))
encoded = encode_chat(rows[1]["messages"], tokenizer, template)
trained = encoded.ids[encoded.loss_mask.astype(bool)]
assert trained[-1] == ByteTokenizer().eos_id
tokenizer.decode(trained[:-1]), int(encoded.loss_mask.sum()), len(encoded.ids)

# %% [markdown]
# ## Pretrain a base model
#
# The base model: `default.py` shortened to 40 steps of a 2-layer model (the real default
# trains 400 steps of 4 layers). Every run is a run directory; the SFT run starts from this
# one's newest checkpoint.

# %%
COMMON = [("trainer.progress_bar", "false"), ("model.num_layers", "2")]
base = load_config(
    str(CONFIGS / "default.py"),
    [
        *COMMON,
        ("run_dir", "runs/base"),
        ("trainer.num_train_steps", "40"),
        ("eval.num_batches", "1"),
    ],
)
base_result = train(base)
base_result.losses[40]

# %% [markdown]
# Asked the held-out questions, the base model continues the text as Python source: it never
# answers in the trained format (the whole reply hyphen-spelt letters, ended by `<eos>`).

# %%
FORMAT = r"[a-z](-[a-z])+"


def replies(run_dir):
    model = load_model(run_dir).model
    return chat_replies(
        model, tokenizer, template, held_out, eos_ids=[tokenizer.eos_id], max_new_tokens=24
    )


before = replies("runs/base")
print(repr(before[0].text))
format_rate(before, FORMAT)

# %% [markdown]
# ## Fine-tune
#
# `sft.py` is `data.source="chat"` with the chat files as `data.train_files` and the held-out
# set as `data.validation_files`, so `eval/validation` is the loss on the held-out replies'
# tokens only. Conversations are packed whole into rows (a row never cuts a conversation; a
# conversation longer than a row is dropped or, as here, cut at its last turn that fits:
# `data.overlong`), and the start-up line counts them. `checkpoint.init_from` names the base
# run.

# %%
sft = load_config(
    SFT,
    [
        *COMMON,
        ("run_dir", "runs/sft"),
        ("checkpoint.init_from", "runs/base"),
        ("trainer.num_train_steps", "100"),
        ("eval.every_steps", "50"),
    ],
)
result = train(sft)
print(result.summary)
assert result.eval["validation"]["loss"] < 2.0

# %% [markdown]
# ## After
#
# The same held-out prompts, greedy: the fine-tuned model answers in the format and stops.
# (Spelling a word it never saw right, letter by letter, is harder than the format; a longer
# run gets more of them right.)

# %%
after = replies("runs/sft")
rate = format_rate(after, FORMAT)
assert rate >= 0.75, [r.text for r in after]
answers = [m[-1]["content"] for m in held_out]
print(f"in the format: {format_rate(before, FORMAT):.0%} before, {rate:.0%} after")
print(f"spelt right:   {sum(r.text == a for r, a in zip(after, answers)) / len(answers):.0%} after")
[(m[-2]["content"], r.text) for m, r in zip(held_out[:5], after)]

# %% [markdown]
# ## Then DPO: learn from preference pairs
#
# `dpo.py` trains `trainer.objective="dpo"` on pairs of replies to the same prompt: the chosen
# one spells the asked word, the rejected one spells another word of the same length, in the
# same format (`configs/dpo_data/`). The SFT model is both the starting policy and the frozen
# reference (`trainer.reference="live"`; `"precomputed"` computes the reference's
# log-probs once before training, and with LoRA the reference is the base model without its
# adapters). On the held-out pairs, `rewards/accuracies` is the share whose implied reward
# `beta * (log pi - log ref)` prefers the chosen reply, and `logps/accuracies` the share the
# policy itself gives more probability to.
#
# `eval.at_start` evaluates the starting model too, before the first step, as step 0. There
# the policy is its own reference, so every implied reward is exactly 0: each pair is a tie,
# `rewards/accuracies` (a strict `>`, as TRL counts it) is 0, and counting ties as half it is
# 50%, chance, by construction. The SFT model's own preference, `logps/accuracies`, is not at
# chance: it gives the right spelling more probability in about 90% of the held-out pairs
# (it learned to copy the prompt's letters, although greedy decoding spells none of them
# right). What DPO adds is measured against the reference: after 40 steps the implied reward
# prefers the chosen reply in about 97% of the held-out pairs (words never trained on), and
# the policy's own preference rises too.

# %%
dpo = load_config(
    str(CONFIGS / "dpo.py"),
    [
        *COMMON,
        ("run_dir", "runs/dpo"),
        ("checkpoint.init_from", "runs/sft"),
        ("trainer.num_train_steps", "40"),
        ("eval.every_steps", "0"),
        ("eval.at_start", "true"),
    ],
)
dpo_result = train(dpo)
print(dpo_result.summary)
start, end = dpo_result.eval_at_start["validation"], dpo_result.eval["validation"]
print(f"{int(end['pairs'])} held-out pairs; implied reward prefers the chosen reply: 50% (all "
      f"ties) before, {end['rewards/accuracies']:.1%} after; the policy itself: "
      f"{start['logps/accuracies']:.1%} before, {end['logps/accuracies']:.1%} after")  # fmt: skip
# Step 0: every pair ties (margin 0), so reward accuracy is chance: 0 strictly, 50% with ties.
assert start["rewards/chosen"] == start["rewards/rejected"] == start["rewards/margins"] == 0.0
assert end["rewards/accuracies"] >= 0.75, end  # measured: 0.969 (62 of 64), seed-fixed
assert end["logps/accuracies"] >= start["logps/accuracies"], (start, end)  # 0.906 -> 0.969
{k: (round(start[k], 3), round(end[k], 3)) for k in end if "accuracies" in k or "margins" in k}

# %% [markdown]
# ## Export
#
# `--export_hf=DIR` (or `Trainer.export_hf`) writes a Hugging Face checkpoint; a run on chat
# data adds its chat template to `tokenizer_config.json` and the ids generation stops at to
# `generation_config.json` (the tokenizer's eos, and the special token that ends a turn in
# templates that have one, such as `<|im_end|>` or `<|eot_id|>`). With a `tokenizer.json`
# (as for `model.init_from_hf` runs), `transformers` loads the export and
# `apply_chat_template` renders as above; `./bazelw run //models:chat -- --checkpoint=DIR`
# talks to it.

# %%
from meltemi.levanter.trainer import Trainer

trainer = Trainer(sft)
trainer.run()  # the run is finished: this restores its final checkpoint
trainer.export_hf("export")
generation = json.loads(pathlib.Path("export/generation_config.json").read_text())
saved = json.loads(pathlib.Path("export/tokenizer_config.json").read_text())
assert generation["eos_token_id"] == tokenizer.eos_id and saved["chat_template"] == template.source
generation["eos_token_id"], saved["eos_token"]
