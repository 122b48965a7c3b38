"""`bazel run //levanter:bench`: the trainer against a hand-written pure-JAX loop, one run.

Both train the same model (`meltemi.models` Llama, the default config's shape at a shorter
sequence) with the same optimizer chain on the same batches; rounds alternate so both see the
same machine load, and each side's best round counts. Prints one JSON object:

    trainer_tokens_per_s, pure_jax_tokens_per_s, trainer_vs_pure_jax_ratio,
    mfu, peak_flops_per_s, compile_s, checkpoint_blocking_s, checkpoint_save_s,
    checkpoint_overhead (save / restore of a `--checkpoint_gib` state: file sizes only,
    device-side array checksums, and the SHA-256 of every file that verification used to cost;
    and each against a plain write / read of the same bytes: `np.save` of every array, fsync'd)

The trainer side goes through the same path as the binary: `resolve(load_config(...))`,
`build_parts(spec)`, `Trainer(spec, parts, mesh)`.

`--checkpoint_only` runs just the checkpoint part.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time

import equinox as eqx
import jax
import numpy as np
import optax

from meltemi.levanter.checkpoint import Checkpointer, step_dir
from meltemi.levanter.config import RunSpec, load_config, resolve
from meltemi.levanter.mesh import make_mesh
from meltemi.levanter.trainer import Trainer, build_parts, measure_peak_flops

DEFAULT = pathlib.Path(__file__).resolve().parent.parent / "configs" / "default.py"


def _spec(run_dir: pathlib.Path, steps: int, args) -> RunSpec:
    """The default config at the bench's shape, checked as the binary checks it."""
    return resolve(_config(run_dir, steps, args))


def _config(run_dir: pathlib.Path, steps: int, args):
    return load_config(
        str(DEFAULT),
        [
            ("run_dir", str(run_dir)),
            ("data.cache_dir", str(run_dir.parent / "cache")),
            ("trainer.num_train_steps", str(steps)),
            ("trainer.progress_bar", "false"),
            ("trainer.train_batch_size", str(args.batch)),
            ("data.seq_len", str(args.seq)),
            ("eval.num_batches", "0"),
            ("eval.every_steps", "0"),
            ("checkpoint.enabled", "false"),
        ],
    )


def pure_jax_round(parts, batches, steps: int) -> float:
    """Tokens/s of a plain jitted loop: init, value_and_grad, optax update, donated state."""
    model = parts.step.init_model(jax.random.key(0))
    params, static = eqx.partition(model, eqx.is_array)
    tx = parts.step.optimizer
    opt_state = tx.init(params)

    def step(params, opt_state, batch):
        def loss(p):
            return parts.step.loss_fn(eqx.combine(p, static), batch)

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = tx.update(grads, opt_state, params, loss=value)
        return optax.apply_updates(params, updates), opt_state, value

    step = jax.jit(step, donate_argnums=(0, 1))
    params, opt_state, value = step(params, opt_state, batches[0])  # compile
    value.block_until_ready()
    start = time.perf_counter()
    for i in range(steps):
        params, opt_state, value = step(params, opt_state, batches[(i + 1) % len(batches)])
    value.block_until_ready()
    tokens = steps * batches[0]["tokens"].size
    return tokens / (time.perf_counter() - start)


def _sha256_files(root: pathlib.Path) -> float:
    """Seconds to SHA-256 every file of a checkpoint, as the manifest check used to."""
    start = time.perf_counter()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda f=f: f.read(1 << 20), b""):
                h.update(block)
    return time.perf_counter() - start


def plain_write_read(root: pathlib.Path, state: dict) -> tuple[float, float]:
    """Seconds to write the same arrays with `np.save` (fsync'd) and to read them back: the
    floor a checkpoint of these bytes on this disk is compared with."""
    root.mkdir(parents=True)
    start = time.perf_counter()
    for name, value in state.items():
        with open(root / f"{name}.npy", "wb") as f:
            np.save(f, np.asarray(jax.device_get(value)))
            f.flush()
            os.fsync(f.fileno())
    write = time.perf_counter() - start
    start = time.perf_counter()
    loaded = [jax.device_put(np.load(root / f"{name}.npy")) for name in state]
    jax.block_until_ready(loaded)
    read = time.perf_counter() - start
    del loaded
    shutil.rmtree(root, ignore_errors=True)
    return write, read


def checkpoint_overhead(root: pathlib.Path, gib: float) -> dict:
    """Save and restore times of a `gib` GiB float32 state with each verify mode."""
    n_arrays = 16
    per_array = int(gib * 2**30 / 4 / n_arrays)
    keys = jax.random.split(jax.random.key(0), n_arrays)
    state = {f"w{i}": jax.random.normal(k, (per_array // 1024, 1024)) for i, k in enumerate(keys)}
    jax.block_until_ready(state)
    template = jax.tree.map(jax.numpy.zeros_like, state)
    out: dict = {"state_gib": round(sum(x.nbytes for x in state.values()) / 2**30, 3)}
    for verify in ("sizes", "checksums"):
        ckpt = Checkpointer(root / verify, verify=verify)
        start = time.perf_counter()
        ckpt.save(1, state, config_json="{}")
        blocking = time.perf_counter() - start
        ckpt.wait()
        saved = time.perf_counter() - start
        start = time.perf_counter()
        _, restored = ckpt.restore(template)
        jax.block_until_ready(restored)
        out[verify] = {
            "save_blocking_s": round(blocking, 3),
            "save_s": round(saved, 3),
            "restore_s": round(time.perf_counter() - start, 3),
        }
        ckpt.close()
        del restored
    sha = _sha256_files(pathlib.Path(step_dir(root / "sizes", 1)))
    out["sha256_of_every_file_s"] = round(sha, 3)
    extra = {k: out["checksums"][k] - out["sizes"][k] for k in ("save_s", "restore_s")}
    out["checksums_extra_s"] = {k: round(v, 3) for k, v in extra.items()}
    # The former scheme hashed every file once after the save and once before the restore.
    out["former_sha256_extra_s"] = {"save_s": round(sha, 3), "restore_s": round(sha, 3)}
    write, read = plain_write_read(root / "plain", state)
    out["plain_write_s"], out["plain_read_s"] = round(write, 3), round(read, 3)
    # The checkpoint's cost over the bare I/O of its bytes (1.0: no overhead).
    out["checksums_save_vs_plain_write"] = round(out["checksums"]["save_s"] / write, 3)
    out["checksums_restore_vs_plain_read"] = round(out["checksums"]["restore_s"] / read, 3)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--checkpoint_gib", type=float, default=2.0, help="0: skip")
    parser.add_argument("--checkpoint_only", action="store_true")
    args = parser.parse_args()
    root = pathlib.Path(tempfile.mkdtemp(prefix="meltemi-bench-"))
    try:
        return _run(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)  # a 2 GiB checkpoint must not stay behind


def _run(args: argparse.Namespace, root: pathlib.Path) -> int:
    overhead = (
        checkpoint_overhead(root / "overhead", args.checkpoint_gib) if args.checkpoint_gib else None
    )
    if args.checkpoint_only:
        print(json.dumps({"checkpoint_overhead": overhead}, indent=1))
        return 0
    mesh = make_mesh({"data": 1}, devices=jax.devices()[:1])
    spec = _spec(root / "trainer", args.steps + 1, args)
    parts = build_parts(spec)
    batches = [
        {k: jax.numpy.asarray(v) for k, v in parts.train_data.sequences(
            np.arange(i * args.batch, (i + 1) * args.batch)).items()}
        for i in range(4)
    ]  # fmt: skip
    peak = measure_peak_flops()
    trainer_rounds, pure_rounds, compile_s = [], [], None
    for _ in range(args.rounds):
        trainer = Trainer(spec, parts, mesh)
        result = trainer.run()
        compile_s = compile_s if compile_s is not None else result.compile_s
        trainer_rounds.append(result.tokens_per_s)
        pure_rounds.append(pure_jax_round(parts, batches, args.steps))
    state = trainer.state
    ckpt = Checkpointer(root / "ckpt", verify="sizes")
    start = time.perf_counter()
    ckpt.save(1, state, config_json=spec.to_json())
    blocking = time.perf_counter() - start
    ckpt.wait()
    save_s = time.perf_counter() - start
    ckpt.close()
    best_trainer, best_pure = max(trainer_rounds), max(pure_rounds)
    flops_per_token = parts.flops_per_token or 0.0
    out = {
        "trainer_tokens_per_s": round(best_trainer, 1),
        "pure_jax_tokens_per_s": round(best_pure, 1),
        "trainer_vs_pure_jax_ratio": round(best_trainer / best_pure, 3),
        "mfu": round(flops_per_token * best_trainer / peak, 4),
        "peak_flops_per_s": round(peak, 1),
        "compile_s": round(compile_s, 2),
        "checkpoint_blocking_s": round(blocking, 4),
        "checkpoint_save_s": round(save_s, 4),
        "checkpoint_overhead": overhead,
        "model": parts.describe,
        "tokens_per_step": args.batch * args.seq,
        "rounds": {"trainer": [round(x, 1) for x in trainer_rounds],
                   "pure_jax": [round(x, 1) for x in pure_rounds]},
    }  # fmt: skip
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
