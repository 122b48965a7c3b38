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
# # Train your first model: run, resume, generate
#
# `meltemi.levanter` turns a Python config file into a run directory: the resolved config,
# one line of metrics per step, checkpoints and a loss curve. This tutorial does from Python
# what `./bazelw run //levanter:train -- --config=levanter/configs/default.py` does from the
# shell: it trains the default model (a small Llama on the bytes of the Python standard
# library, which ships with the interpreter, so nothing is downloaded), plots its loss,
# interrupts a run and resumes it bit for bit, and generates text with the result.
#
# The default run is 400 steps (under two minutes on a 2-core CPU); here we shrink it with
# overrides so that the whole notebook takes about a minute.

# %%
import pathlib

import jax
import matplotlib.pyplot as plt

import meltemi.models as mm
from meltemi.levanter.config import ConfigError, load_config, resolve
from meltemi.levanter.evaluation import load_model
from meltemi.levanter.tracking import read_metrics
from meltemi.levanter.trainer import train

CONFIG = pathlib.Path(mm.__file__).parents[4] / "levanter" / "configs" / "default.py"
assert CONFIG.exists(), CONFIG
jax.devices()

# %% [markdown]
# ## The config
#
# `load_config("file.py[:variant]", overrides)` calls the file's `get_config`, applies
# `(dotted key, text)` overrides exactly like `--config.<key>=<text>` on the command line, and
# records where each value came from. `resolve` checks every value once and returns frozen,
# typed sections: the only form the trainer reads.

# %%
STEPS = 40
SHRINK = [
    ("trainer.num_train_steps", str(STEPS)),
    ("trainer.train_batch_size", "8"),
    ("trainer.progress_bar", "false"),
    ("data.seq_len", "64"),
    ("model.num_layers", "2"),
    ("eval.every_steps", "20"),
    ("eval.num_batches", "2"),
    ("eval.batch_size", "8"),
    ("checkpoint.save_every_steps", "10"),
]


def config(run_dir):
    return load_config(str(CONFIG), [*SHRINK, ("run_dir", run_dir)])


resolved = config("runs/first")
spec = resolve(resolved)
assert spec.trainer.num_train_steps == STEPS and spec.model.vocab_size == 259
{key: resolved.provenance[key] for key in ("model.hidden_dim", "model.num_layers", "run_dir")}

# %% [markdown]
# A typo in a key is an error that names the key and suggests the right one (the binary
# prints it as one `error:` line and exits with status 2):

# %%
try:
    load_config(str(CONFIG), [("trainer.num_train_step", "10")])
except ConfigError as e:
    message = str(e)
assert "trainer.num_train_steps" in message
print(message)

# %% [markdown]
# ## Train
#
# `train(spec)` builds everything from the config (the token store, cached under
# `~/.cache/meltemi/data`; the model; AdamW with its schedule; the mesh over the local
# devices), runs the loop and returns a `RunResult`: the losses of each step it ran, the last
# evaluation, and where it wrote everything.

# %%
result = train(spec)
print(result.summary)
assert result.step == STEPS and result.start_step == 0
assert result.losses[STEPS] < 0.7 * result.losses[1]
sorted(p.name for p in result.run_dir.iterdir())

# %% [markdown]
# ## The loss curve
#
# `metrics.jsonl` holds one JSON object per step (train loss, learning rate, gradient and
# update norms, throughput, ...) and the evaluation results on the steps that evaluated.

# %%
records = read_metrics(result.run_dir / "metrics.jsonl")
train_curve = [(r["step"], r["train/loss"]) for r in records if "train/loss" in r]
eval_curve = [(r["step"], r["eval/stdlib/loss"]) for r in records if "eval/stdlib/loss" in r]
assert [s for s, _ in train_curve] == list(range(1, STEPS + 1))
assert [s for s, _ in eval_curve] == [20, 40]
assert eval_curve[-1][1] < eval_curve[0][1]

plt.figure(figsize=(6, 3))
plt.plot(*zip(*train_curve, strict=True), label="train")
plt.plot(*zip(*eval_curve, strict=True), "o-", label="eval (stdlib validation split)")
plt.xlabel("step")
plt.ylabel("loss (nats per byte)")
plt.legend()
plt.show()
{"eval at step 40": result.eval["stdlib"]}

# %% [markdown]
# ## Interrupt, then resume
#
# A preempted job is started again with the same command; it resumes from the newest intact
# checkpoint in its run directory. Here we stop a second run after 25 steps on purpose
# (`stop_after`; SIGTERM or a kill does the same from outside), then call `train` again.
# Checkpoints are every 10 steps, so the restart goes back to step 20 and redoes 21 to 25.

# %%
cut = resolve(config("runs/interrupted"))
first = train(cut, stop_after=25)
second = train(cut)
assert (first.start_step, first.step) == (0, 25)
assert (second.start_step, second.step) == (20, STEPS)
(first.step, second.start_step, second.step)

# %% [markdown]
# The data position is part of the checkpoint (a step's rows are a pure function of the step),
# and so are the parameters, the optimizer state and the PRNG key. So the resumed run is not
# merely close to the uninterrupted one: every loss is the same float.

# %%
stitched = {**first.losses, **second.losses}
assert stitched == result.losses  # bitwise equal, step by step
assert second.eval == result.eval
max(abs(stitched[s] - result.losses[s]) for s in stitched)

# %% [markdown]
# ## Load the result and generate text
#
# `load_model` reads a run directory (its newest complete checkpoint), a checkpoint or a
# Hugging Face directory. `.model` is a `meltemi.models.Transformer`: the same module the
# trainer trained, ready for `meltemi.models.generate`. The tokenizer is bytes, so a prompt
# is its UTF-8 bytes and the output decodes back to text.

# %%
loaded = load_model(str(result.run_dir))
assert loaded.step == STEPS
model, tokenizer = loaded.model, loaded.tokenizer
prompt = "def __init__(self"
room = model.config.max_seq_len - len(prompt)  # the model saw 64-byte rows: its context
[ids] = mm.generate(model, [tokenizer.encode(prompt).tolist()], max_new_tokens=room)
assert 0 < len(ids) <= room
print(prompt + tokenizer.decode(ids))

# %% [markdown]
# Forty steps of a 2-layer model is not much: the continuation is repetitive, not yet Python
# (the full 400-step default run gets to 2.2 bits per byte), but it has learned which bytes
# source code is made of: every one is printable text, where an untrained model draws from
# all 259 ids. Greedy decoding is deterministic: the same prompt gives the same tokens.

# %%
continuation = bytes(i for i in ids if i < 256)
printable = sum(32 <= b < 127 or b == 10 for b in continuation) / len(ids)
assert printable > 0.9, printable
again = mm.generate(model, [tokenizer.encode(prompt).tolist()], max_new_tokens=room)
assert again == [ids]
(len(ids), round(printable, 3))

# %% [markdown]
# ## Where to go next
#
# - The shell: `./bazelw run //levanter:train -- --config=levanter/configs/default.py`
#   (add `--config.<key>=<value>` for any override above), `//levanter:eval` and
#   `//levanter:plot` on the run directory.
# - [Scaling out](05_scaling_out.ipynb): the same run on two slice processes, and planning a
#   32B run with `--dry_run`.
# - [Optimizers](06_optimizers.ipynb): what the AdamW of this run does, and what else to use.
