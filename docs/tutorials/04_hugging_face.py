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
# # Hugging Face round trip: load, compare, fine-tune, save, reload
#
# `meltemi.models.hf` reads and writes the checkpoints `transformers` uses: `config.json`,
# safetensors shards and their index. Loading is exact (same logits), streamed and sharded
# (each device reads only its own piece); saving writes what `from_pretrained` loads. Here we
# do the round trip a user does with a real checkpoint, on a small random Llama made on the
# spot (nothing is downloaded): load it, check the logits against `transformers`, fine-tune a
# few steps in JAX, save, and load the result back in `transformers`.

# %%
import pathlib
import tempfile
import warnings

import equinox as eqx
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax
import torch
import transformers

import meltemi.models as mm

warnings.filterwarnings("ignore", message="IProgress not found")  # no widgets here
transformers.utils.logging.disable_progress_bar()
work = pathlib.Path(tempfile.mkdtemp())
_ = torch.manual_seed(0)

# %% [markdown]
# ## A checkpoint to start from
#
# A small Llama with the shapes that catch mistakes: a head size that is not `hidden / heads`,
# grouped-query attention (2 KV heads for 6 query heads), an odd vocabulary.

# %%
hf_config = transformers.LlamaConfig(
    vocab_size=301,
    hidden_size=96,
    intermediate_size=200,
    num_hidden_layers=3,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=24,
    max_position_embeddings=256,
    rope_theta=10_000.0,
    tie_word_embeddings=False,
)
torch_model = transformers.LlamaForCausalLM(hf_config).eval()
torch_model.save_pretrained(work / "base")
sorted(p.name for p in (work / "base").iterdir())

# %% [markdown]
# ## Load it, and compare the logits
#
# `hf.load` returns the model and its `ModelConfig` (the family and every size, read from
# `config.json`; options it does not support are errors, never silently ignored).

# %%
model, config = mm.hf.load(work / "base")
tokens = np.random.default_rng(0).integers(0, hf_config.vocab_size, (2, 40))
ours = np.asarray(model(jnp.asarray(tokens, jnp.int32)).array)
with torch.no_grad():
    theirs = torch_model(torch.tensor(tokens)).logits.numpy()
max_diff = float(np.abs(ours - theirs).max())
assert max_diff < 1e-4, max_diff
(config.family, config.num_layers, config.head_dim, max_diff)

# %% [markdown]
# ## Fine-tune a few steps in JAX
#
# The model is an equinox module over named axes: `model.loss(tokens)` is next-token
# cross-entropy, and any optax optimizer trains it. We teach it one short "sentence".

# %%
sentence = jnp.asarray([[5, 17, 42, 99, 7, 250, 13, 61] * 4], jnp.int32)
optimizer = optax.adamw(3e-3)
opt_state = optimizer.init(eqx.filter(model, eqx.is_array))


@eqx.filter_jit
def train_step(model, opt_state):
    loss, grads = eqx.filter_value_and_grad(lambda m: m.loss(sentence))(model)
    updates, opt_state = optimizer.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    return eqx.apply_updates(model, updates), opt_state, loss


losses = []
for _ in range(30):
    model, opt_state, loss = train_step(model, opt_state)
    losses.append(float(loss))
assert losses[-1] < 0.2 * losses[0]
plt.figure(figsize=(5, 2.5))
plt.plot(losses)
plt.xlabel("step")
plt.ylabel("loss")
plt.show()

# %% [markdown]
# ## Save, and reload in `transformers`
#
# `hf.save` streams one tensor at a time to safetensors shards (never the whole model on the
# host) and writes `config.json` and `generation_config.json`.

# %%
mm.hf.save(model, config, work / "finetuned")
reloaded = transformers.AutoModelForCausalLM.from_pretrained(work / "finetuned").eval()
with torch.no_grad():
    theirs = reloaded(torch.tensor(np.asarray(sentence))).logits.numpy()
ours = np.asarray(model(sentence).array)
max_diff = float(np.abs(ours - theirs).max())
assert max_diff < 1e-4, max_diff
max_diff

# %% [markdown]
# Both libraries now continue the sentence the same way, greedy decoding token for token:

# %%
prompt = [5, 17, 42]
ours = mm.generate(model, [prompt], max_new_tokens=8, eos_token_id=None)[0]
with torch.no_grad():
    out = reloaded.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)
theirs = out[0, len(prompt) :].tolist()
assert ours == theirs, (ours, theirs)
ours

# %% [markdown]
# With a real checkpoint the same calls apply, with two additions a large model needs: pass a
# mesh (`hf.load(path, mesh=mesh)` under an `axis_mapping`) and every parameter is created
# sharded, each device reading only its piece of the safetensors files; and in the trainer,
# `--config.model.init_from_hf=PATH` starts a run from it and `--export_hf=DIR` writes the
# result.
