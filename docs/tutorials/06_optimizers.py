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
# # Optimizers: AdamC vs AdamW, and surviving a loss spike
#
# `meltemi.levanter.optim` provides the optimizers of the Marin recipes as ordinary optax
# `GradientTransformation`s: AdamW with decoupled decay, **AdamC** (Defazio, "Why Gradients
# Rapidly Increase Near the End of Training", 2025, arXiv:2506.02285), warmup-stable-decay
# schedules, **skip-step** and **update-norm clipping**. The trainer builds them from its
# `optimizer` config; here we use them directly on a problem small enough to run hundreds of
# steps in seconds, so every effect can be seen and checked.

# %%
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax

from meltemi.levanter import optim

# %% [markdown]
# ## The problem: a normalized layer
#
# Large models are full of layers followed by a normalization (RMSNorm), which makes the loss
# invariant to the scale of their weights. We mimic one: `x -> rmsnorm(x @ W) @ V` with a fixed
# readout `V`, classifying inputs by a hidden linear "teacher".

# %%
D, H, C = 32, 64, 10
readout = jax.random.normal(jax.random.key(7), (H, C))
teacher = jax.random.normal(jax.random.key(8), (D, C))


def rms_norm(h):
    return h / jnp.sqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-6)


def loss_fn(params, x, y):
    logits = rms_norm(x @ params["w"]) @ readout
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def batch(step):
    x = jax.random.normal(jax.random.key(step), (128, D))
    return x, jnp.argmax(x @ teacher, axis=-1)


def init_params():
    return {"w": jax.random.normal(jax.random.key(0), (D, H)) / np.sqrt(D)}


# %% [markdown]
# ## AdamW vs AdamC during the learning-rate decay
#
# With AdamW the weight decay applied per step is `lr * wd`. For a scale-invariant weight the
# gradient pushes its norm up and the decay pulls it down; they balance where
# `||W|| ~ sqrt(lr / wd)`, and the gradient, which scales like `1 / ||W||`, settles at
# `~ sqrt(wd / lr)`. So when the schedule decays `lr` towards zero at the end of training, the
# weights shrink and **the gradient norm stays high or grows** (in large models it grows
# sharply), just when training should be settling.
# AdamC (here `adamc="decay"`: during the decay phase) scales the decay with the schedule
# (`wd * lr / lr_max`), which keeps the balance, and the weight norm, constant through it.

# %%
STEPS, LR, WD = 600, 0.02, 1.0
schedule = optim.wsd_schedule(LR, total_steps=STEPS, warmup=0.02, decay=0.5)


def train_decay(adamc):
    tx = optim.adamw(schedule, weight_decay=WD, adamc=adamc, lr_max=LR)
    params = init_params()
    state = tx.init(params)

    @jax.jit
    def step(params, state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, state = tx.update(grads, state, params)
        return (optax.apply_updates(params, updates), state,
                (loss, jnp.linalg.norm(grads["w"]), jnp.linalg.norm(params["w"])))  # fmt: skip

    rows = []
    for t in range(STEPS):
        params, state, row = step(params, state, *batch(t))
        rows.append([float(v) for v in row])
    return np.array(rows)


adamw_run, adamc_run = train_decay("off"), train_decay("decay")

fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
for run, name in [(adamw_run, "AdamW"), (adamc_run, "AdamC")]:
    for ax, col, title in zip(
        axes, range(3), ["loss", "gradient norm", "weight norm"], strict=True
    ):
        ax.plot(run[:, col], label=name, lw=1)
        ax.set(title=title, xlabel="step")
for ax in axes:
    ax.axvline(STEPS // 2, color="gray", ls=":", lw=1)  # the decay starts
axes[0].set_yscale("log")
axes[0].legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# The dotted line is where the decay starts. Measured over the last 30 steps:

# %%
end = slice(-30, None)
summary = {
    name: {
        "loss": run[end, 0].mean(),
        "grad_norm": run[end, 1].mean(),
        "weight_norm": run[end, 2].mean(),
    }
    for name, run in [("AdamW", adamw_run), ("AdamC", adamc_run)]
}
# AdamW's weights shrank during the decay and its gradients stayed large; AdamC's did not.
assert summary["AdamC"]["weight_norm"] > 1.3 * summary["AdamW"]["weight_norm"]
assert summary["AdamW"]["grad_norm"] > 1.5 * summary["AdamC"]["grad_norm"]
{name: {k: round(float(v), 3) for k, v in s.items()} for name, s in summary.items()}

# %% [markdown]
# In the trainer: `--config.optimizer.adamc=decay`. By default AdamC's correction applies to the
# hidden layers and not to the output layer (`lm_head`), as in the paper.
#
# ## A loss spike, made on purpose
#
# Now a constant learning rate and one bad batch: at step 150 the loss is multiplied by 10,000
# (think of a corrupt shard, or a numerically broken batch). We compare four runs on the same
# data: no spike (the reference), plain AdamW, AdamW inside `skip_step`, and AdamW followed by
# `clip_update_norm`. We track the loss on held-out batches.

# %%
SPIKE, STEPS2 = 150, 300


def train_spike(tx, spike=True):
    params = init_params()
    state = tx.init(params)

    @jax.jit
    def step(params, state, x, y, scale):
        loss, grads = jax.value_and_grad(lambda p: scale * loss_fn(p, x, y))(params)
        updates, state = tx.update(grads, state, params, loss=loss)
        return optax.apply_updates(params, updates), state

    held_out, skipped = [], []
    for t in range(STEPS2):
        scale = jnp.float32(1e4 if spike and t == SPIKE else 1.0)
        params, state = step(params, state, *batch(t), scale)
        held_out.append(float(loss_fn(params, *batch(10_000 + t))))
        skipped.append(bool(getattr(state, "skipped", False)))
    return np.array(held_out), np.array(skipped)


def adamw():
    return optim.adamw(3e-3)


runs = {
    "no spike": train_spike(optax.with_extra_args_support(adamw()), spike=False),
    "AdamW": train_spike(optax.with_extra_args_support(adamw())),
    "skip_step(AdamW)": train_spike(optim.skip_step(adamw(), window=32, sigma=3.0)),
    "AdamW + clip_update_norm": train_spike(
        optax.with_extra_args_support(
            optax.chain(adamw(), optim.clip_update_norm(window=32, sigma=3.0))
        )
    ),
}
plt.figure(figsize=(7, 3.5))
for name, (losses, _) in runs.items():
    plt.plot(losses, label=name, lw=1)
plt.axvline(SPIKE, color="gray", ls=":", lw=1)
plt.xlabel("step")
plt.ylabel("held-out loss")
plt.legend()
plt.show()

# %% [markdown]
# One step of a huge gradient fills Adam's moment estimates: the update is bounded, but the
# second moment stays enormous for many steps, so plain AdamW barely moves afterwards and the
# loss drifts up. Clipping the update norm bounds that one step but leaves the moments
# polluted. `skip_step` sees the loss and gradient norm far above their recent mean plus
# `sigma` standard deviations and applies **no update at all**, moments included, so the run
# continues as if the bad batch had never been there.

# %%
after = slice(SPIKE + 1, SPIKE + 60)
mean_after = {name: float(losses[after].mean()) for name, (losses, _) in runs.items()}
reference = mean_after["no spike"]
assert runs["skip_step(AdamW)"][1][SPIKE]  # the bad step was skipped
assert abs(mean_after["skip_step(AdamW)"] - reference) < 0.05 * reference
assert mean_after["AdamW"] > 1.5 * reference
{name: round(v, 3) for name, v in mean_after.items()}

# %% [markdown]
# In the trainer: `optimizer.skip_step_window` / `skip_step_sigma` and
# `optimizer.update_clip_window` / `update_clip_sigma`; skipped steps are logged as
# `optim/skipped` with the reason, and by default a skipped step still spends its slot of the
# learning-rate schedule, so the schedule follows the trainer's step.
