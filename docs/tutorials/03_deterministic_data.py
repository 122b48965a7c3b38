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
# # Deterministic data: a store, a Feistel shuffle, provenance and mixtures
#
# In `meltemi.data` the batch of any step is a **pure function** of (store, config, seed,
# step). There is no iterator state to save: a run resumed after preemption asks for step
# 1,234 and gets exactly the rows the uninterrupted run would have seen, on any number of
# hosts. This tutorial builds a small store, looks inside the shuffle that makes this possible,
# traces a row back to its document, and mixes two sources with weights that change mid-run.

# %%
import pathlib
import sysconfig
import tempfile

import matplotlib.pyplot as plt
import numpy as np

from meltemi.data import (
    ByteTokenizer,
    FeistelPermutation,
    LinearPermutation,
    MixtureDataset,
    PackedDataset,
    TextFiles,
    build_store,
)

work = pathlib.Path(tempfile.mkdtemp())

# %% [markdown]
# ## A token store
#
# Any machine with Python has text on it: the standard library's source. We take two slices of
# it, the `json` and `email` packages, as two small "sources". `build_store` tokenizes them
# (here byte-level: 256 bytes plus bos/eos/pad) into zstd-compressed zarr shards with random
# access by document and token range. A build is resumable and finished atomically; opening an
# existing store checks the tokenizer's fingerprint.

# %%
stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
json_files = sorted(str(p) for p in (stdlib / "json").glob("*.py"))
email_files = sorted(str(p) for p in (stdlib / "email").glob("*.py"))
tokenizer = ByteTokenizer()
json_store = build_store([TextFiles("json", json_files)], tokenizer, work / "json")
email_store = build_store([TextFiles("email", email_files)], tokenizer, work / "email")
assert json_store.num_documents == len(json_files) > 3
(json_store.num_documents, json_store.num_tokens, email_store.num_documents, email_store.num_tokens)

# %% [markdown]
# A `PackedDataset` cuts the store into fixed-length rows (`stream` mode concatenates documents
# with eos between them; `document` mode never splits a short document and pads instead).
# `batch(step)` needs nothing but the step:

# %%
ds = PackedDataset(json_store, seq_len=128, batch_size=8, seed=0)
b1, b2 = ds.batch(step=3), ds.batch(step=3)
assert all(np.array_equal(b1[k], b2[k]) for k in b1)
{k: v.shape for k, v in b1.items()}

# %% [markdown]
# Several hosts each ask for their own slice of the *same* global batch, so the batch of a
# step does not depend on how many hosts there are:

# %%
halves = [ds.batch(step=3, process_index=i, process_count=2)["tokens"] for i in range(2)]
assert np.array_equal(np.concatenate(halves), b1["tokens"])
print(tokenizer.decode(b1["tokens"][0])[:200])

# %% [markdown]
# ## The Feistel shuffle, and why it is a bijection
#
# Which rows make up step `s`? A permutation of all sequence indices, evaluated only where
# needed. A Feistel network splits an index `x` into two halves `(L, R)` and applies rounds
# `(L, R) -> (R, L + F(R) mod a)` with a keyed round function `F`. Each round can be undone
# (`L = new_R - F(new_L)`), whatever `F` is, so the whole network is a bijection on its domain
# by construction: no table, O(1) memory, any index in O(rounds). When `n` is not a product of
# the two radices, *cycle walking* re-applies the network until the value lands below `n`,
# which keeps it a bijection of `0..n-1`.

# %%
n = 10_007  # prime: no factorisation helps
perm = FeistelPermutation(n, seed=1)
image = perm(np.arange(n))
assert np.array_equal(np.sort(image), np.arange(n))  # every index exactly once
assert np.array_equal(perm.inverse(image), np.arange(n))  # and it can be undone
image[:10]

# %% [markdown]
# Why not the simpler affine shuffle `i -> (a * i + b) mod n`? It is also a bijection, but
# neighbours stay a constant stride apart. On data sorted by source or length (which stores
# often are), that leaks into every batch:

# %%
linear = LinearPermutation(n, seed=1)
fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
for ax, (name, p) in zip(axes, [("linear (affine)", linear), ("Feistel", perm)], strict=True):
    ax.scatter(np.arange(400), p(np.arange(400)), s=4)
    ax.set(title=name, xlabel="position in the shuffled order", ylabel="original index")
plt.tight_layout()
plt.show()

# %% [markdown]
# Consecutive gaps of the affine permutation take at most two values; Feistel's look random:

# %%
gaps_linear = len(np.unique(np.diff(linear(np.arange(1000)))))
gaps_feistel = len(np.unique(np.diff(perm(np.arange(1000)))))
assert gaps_linear <= 2 < 500 < gaps_feistel
(gaps_linear, gaps_feistel)

# %% [markdown]
# ## Provenance: which document is row r of step s?
#
# Because rows are computed, they can be traced back. `locate(step, row)` lists the document
# pieces packed into a row; `steps_of(document)` lists every (step, row) that used a document.

# %%
pieces = ds.locate(step=3, row=0)
first = pieces[0]
text = tokenizer.decode(json_store.tokens(first.document, first.token_offset,
                                          first.token_offset + first.length))  # fmt: skip
assert text in tokenizer.decode(b1["tokens"][0])
print(json_store.location(first.document), first)
used = ds.steps_of(first.document, max_step=50)
assert (3, 0) in used
used[:5]

# %% [markdown]
# ## Mixtures with stages
#
# A `MixtureDataset` draws rows from several datasets by weight. The weights hold at *every*
# row (after any number of rows, each component is within one row of its share), not just on
# average, and they can change at a step: here `json` is 75% until step 10, then 25%.

# %%
parts = {
    "json": PackedDataset(json_store, seq_len=128, batch_size=8, seed=0),
    "email": PackedDataset(email_store, seq_len=128, batch_size=8, seed=0),
}
mix = MixtureDataset(
    parts, [(0, {"json": 0.75, "email": 0.25}), (10, {"json": 0.25, "email": 0.75})], batch_size=8
)
steps = np.arange(20)
json_share = [float(np.mean(mix.batch(int(s))["component"] == 0)) for s in steps]
assert json_share[:10] == [0.75] * 10 and json_share[10:] == [0.25] * 10
plt.figure(figsize=(6, 2.5))
plt.step(steps, json_share, where="post")
plt.ylim(0, 1)
plt.xlabel("step")
plt.ylabel("share of json rows")
plt.show()

# %% [markdown]
# Exact at every step, not only on average, and still a pure function of the step: a run that
# restarts at step 12 sees the same mixture. The trainer builds exactly these objects from its
# `data` config (`data.source="mixture"`); see *Train your first model*.
