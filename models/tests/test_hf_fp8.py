"""`hf.load` of block-scaled FP8 checkpoints (Qwen3-FP8 / DeepSeek-V3 style): every float8
weight `W` has a `W_scale_inv` block scale and config.json a `quantization_config`; the
weights are dequantized on load, `W[i, j] * scale_inv[i // b0, j // b1]` in float32, then cast.

The checkpoints are quantized here in numpy (ml_dtypes' e4m3), with block sizes that do not
divide the weights' dimensions (partial edge blocks) and, on 8 fake devices, pieces that cut
blocks.
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)

import json  # noqa: E402
import tracemalloc  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import model_testing as T  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402
from test_hf_remote import READS, bucket  # noqa: E402, F401  (fixture: a stand-in for gs://)

import meltemi.haliax as hax  # noqa: E402
import meltemi.models as mm  # noqa: E402
from meltemi.haliax import partitioning  # noqa: E402
from meltemi.models import hf  # noqa: E402
from meltemi.models.hf import _checkpoints, _safetensors  # noqa: E402

F8 = np.dtype(ml_dtypes.float8_e4m3fn)
BF16 = np.dtype(ml_dtypes.bfloat16)
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
BLOCK = (8, 12)  # rows x columns, unequal so that a swapped block size cannot hide
# Qwen3 with hidden 40 (5 columns per device under embed -> 8 devices, cutting the 12-column
# blocks), mlp 44 (11 rows per device under mlp -> 4, cutting the 8-row blocks); q rows 48.
QWEN3 = mm.get_preset("tiny-qwen3").replace(hidden_dim=40)
QWEN3_MOE = mm.get_preset("tiny-qwen3-moe").replace(hidden_dim=40)
NOT_CONVERTED = "model.layers.1.mlp.down_proj"  # stays bf16, as modules_to_not_convert says
SCALE = ".weight_scale_inv"


def _is_quantized(key: str) -> bool:
    return ".layers." in key and key.endswith("proj.weight") and not key.startswith(NOT_CONVERTED)


def _expand(scale: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    return np.repeat(np.repeat(scale, BLOCK[0], 0), BLOCK[1], 1)[: shape[0], : shape[1]]


def _quantize(w: np.ndarray, rng: np.random.Generator, scale_dtype) -> tuple:
    """(e4m3 values, block scale_inv): per-block amax / 448, as DeepSeek's and transformers'
    quantizers do. The weights are first scaled by a random power of two per block, so that
    a scale applied to the wrong block changes the result by 2x or more."""
    grid = tuple(-(-n // b) for n, b in zip(w.shape, BLOCK, strict=True))
    w = w * _expand(2.0 ** rng.integers(-3, 3, grid), w.shape)
    padded = np.zeros([g * b for g, b in zip(grid, BLOCK, strict=True)], np.float32)
    padded[: w.shape[0], : w.shape[1]] = w
    amax = np.abs(padded.reshape(grid[0], BLOCK[0], grid[1], BLOCK[1])).max(axis=(1, 3))
    scale = np.maximum(amax, 1e-6) / 448.0
    if scale_dtype == E8M0:  # powers of two only (DeepSeek-V3.1's ue8m0): round up
        scale = 2.0 ** np.ceil(np.log2(scale))
    scale = scale.astype(scale_dtype)
    return (w / _expand(scale.astype(np.float32), w.shape)).astype(F8), scale


def dequantize(q: np.ndarray, scale: np.ndarray, dtype) -> np.ndarray:
    """The reference: the float32 product, then the cast (transformers' Fp8Dequantize)."""
    return (q.astype(np.float32) * _expand(scale.astype(np.float32), q.shape)).astype(dtype)


def fp8_checkpoint(directory, config, seed=0, **quantization) -> dict[str, np.ndarray]:
    """Writes a block-scaled FP8 checkpoint of a random `config` model with the `safetensors`
    package; returns its tensors."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for i, (key, w) in enumerate(sorted(T.random_state_dict(config, seed).items())):
        if not _is_quantized(key):
            tensors[key] = w.astype(BF16)  # as real FP8 checkpoints store them
            continue
        scale_dtype = (np.float32, BF16, E8M0)[i % 3]  # every kind of scale occurs
        tensors[key], tensors[key.removesuffix(".weight") + SCALE] = _quantize(w, rng, scale_dtype)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    q = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": list(BLOCK),
        "modules_to_not_convert": ["lm_head", NOT_CONVERTED],
    } | quantization
    hf_config = mm.to_hf_config(config) | {"dtype": "bfloat16", "quantization_config": q}
    (directory / "config.json").write_text(json.dumps(hf_config))
    return tensors


def expected_state(tensors: dict[str, np.ndarray], dtype) -> dict[str, np.ndarray]:
    out = {}
    for key, value in tensors.items():
        if key.endswith(SCALE):
            continue
        scale = tensors.get(key.removesuffix(".weight") + SCALE)
        out[key] = value.astype(dtype) if scale is None else dequantize(value, scale, dtype)
    return out


def _assert_state(model, want: dict[str, np.ndarray]) -> None:
    got = hf.state_dict(model)
    assert sorted(got) == sorted(want)
    for key in want:
        assert got[key].dtype == want[key].dtype, key
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


@pytest.mark.parametrize("config", [QWEN3, QWEN3_MOE], ids=["qwen3", "qwen3_moe"])
def test_load_dequantizes_exactly_with_partial_edge_blocks(config, tmp_path):
    tensors = fp8_checkpoint(tmp_path, config)
    assert any(F8 == t.dtype and t.shape[0] % BLOCK[0] for t in tensors.values())
    assert any(F8 == t.dtype and t.shape[1] % BLOCK[1] for t in tensors.values())
    kinds = {t.dtype for k, t in tensors.items() if k.endswith(SCALE)}
    assert kinds == {np.dtype(np.float32), BF16, E8M0}
    model, loaded_config = hf.load(tmp_path)  # no dtype: bfloat16 for an fp8 checkpoint
    assert loaded_config == config
    _assert_state(model, expected_state(tensors, BF16))
    model32, _ = hf.load(tmp_path, dtype=jnp.float32)
    want32 = expected_state(tensors, np.float32)
    _assert_state(model32, want32)
    # The scales were applied: the raw float8 values differ from the weights.
    key = "model.layers.0.self_attn.o_proj.weight"
    assert not np.allclose(tensors[key].astype(np.float32), want32[key], rtol=0.1)


MESH_CASES = {
    # FSDP over 8 devices: 5-column pieces cut the 12-column blocks.
    "fsdp8": ({"data": 8}, {"embed": "data"}),
    # Rows too: mlp over 4 (11-row pieces cut 8-row blocks), and head_size split inside the
    # flattened q/k/v rows (a strided slice after the covering rows are read).
    "rows": ({"data": 2, "model": 4}, {"embed": "data", "mlp": "model", "head_size": "data"}),
}


@pytest.mark.parametrize("case", sorted(MESH_CASES))
def test_sharded_load_dequantizes_pieces_that_cut_blocks(case, tmp_path):
    shape, mapping = MESH_CASES[case]
    tensors = fp8_checkpoint(tmp_path, QWEN3)
    mesh = partitioning.make_mesh(shape)
    model, _ = hf.load(tmp_path, mesh=mesh, axis_mapping=mapping)
    cut = 0
    for leaf in jax.tree.leaves(model, is_leaf=hax.is_named_array):
        spec = partitioning.pspec_for_axis(leaf.axes, mapping, mesh)
        assert leaf.array.sharding == NamedSharding(mesh, spec)
        cut += any(p is not None for p in spec)
    assert cut >= 5
    _assert_state(model, expected_state(tensors, BF16))


class _SecondProcess:
    """The sharding as process 1 of 2 sees it: only devices 4-7 are its own, so its rows of a
    row-sharded tensor (`o_proj`, `down_proj` under embed -> data) start inside a block."""

    def __init__(self, real: NamedSharding):
        self.real = real

    def addressable_devices_indices_map(self, shape):
        return {
            d: i for d, i in self.real.addressable_devices_indices_map(shape).items() if d.id >= 4
        }


def test_a_process_reading_rows_from_inside_a_block_gets_their_scales(tmp_path, monkeypatch):
    tensors = fp8_checkpoint(tmp_path, QWEN3)
    mesh, mapping = partitioning.make_mesh({"data": 8}), {"embed": "data"}
    whole, _ = hf.load(tmp_path, dtype=jnp.float32)

    def sharding_of(t):
        return _SecondProcess(
            NamedSharding(mesh, partitioning.pspec_for_axis(t.axes, mapping, mesh))
        )

    def assemble(shape, sharding, singles):  # this process's pieces, NaN elsewhere
        full = np.full(shape, np.nan, np.float32)
        where = sharding.addressable_devices_indices_map(shape)
        for single in singles:
            full[where[next(iter(single.devices()))]] = np.asarray(single)
        return jnp.asarray(full)

    starts = {}
    read_rows = _safetensors.Checkpoint.read_rows

    def recording(self, name, start=0, stop=None):
        starts[name] = start
        return read_rows(self, name, start, stop)

    monkeypatch.setattr(_checkpoints, "_sharding_of", lambda mesh, mapping: sharding_of)
    monkeypatch.setattr(jax, "make_array_from_single_device_arrays", assemble)
    monkeypatch.setattr(_safetensors.Checkpoint, "read_rows", recording)
    half, _ = hf.load(tmp_path, dtype=jnp.float32)
    key = "model.layers.0.mlp.down_proj.weight"  # embed rows [20, 40): block 2 from row 4
    assert starts[key] == 20 and 20 % BLOCK[0] and key.replace(".weight", SCALE) in tensors
    got, want = hf.state_dict(half), hf.state_dict(whole)
    seen = 0
    for k in want:
        mask = ~np.isnan(got[k])
        np.testing.assert_array_equal(got[k][mask], want[k][mask], err_msg=k)
        seen += mask.any() and not mask.all()
    assert seen >= 7  # o_proj and down_proj of every layer, at least, were only half read
    np.testing.assert_array_equal(got[key][20:], want[key][20:])


@pytest.fixture
def fresh_bucket(bucket):  # noqa: F811
    # etils.epath keeps the first fsspec filesystem per protocol (and with it the bucket root
    # of whichever module's fixture ran first): forget it on the way in and out.
    from etils.epath import backend

    backend._FileSystemSpecBackend._get_filesystem.cache_clear()
    yield bucket
    backend._FileSystemSpecBackend._get_filesystem.cache_clear()


def test_a_bucket_load_fetches_each_tensor_and_its_scale_once(fresh_bucket):
    tensors = fp8_checkpoint(fresh_bucket / "b" / "fp8", QWEN3)
    READS.clear()
    mesh = partitioning.make_mesh({"data": 8})
    model, _ = hf.load("gs://b/fp8", mesh=mesh, axis_mapping={"embed": "data"})
    _assert_state(model, expected_state(tensors, BF16))
    # Beyond the header (its length, then its JSON), one ranged read per tensor and per scale,
    # each of all its bytes.
    path = fresh_bucket / "b" / "fp8" / "model.safetensors"
    header = int.from_bytes(path.read_bytes()[:8], "little")
    reads = [(start, size) for name, start, size in READS if name.endswith("model.safetensors")]
    assert reads[:2] == [(0, 8), (8, header)]
    assert sorted(size for _, size in reads[2:]) == sorted(t.nbytes for t in tensors.values())


def test_logits_match_transformers_loading_the_same_fp8_checkpoint(tmp_path):
    # transformers dequantizes fine-grained FP8 on a CPU-only machine (dequantize=True is
    # forced without a GPU; it needs accelerate), but only for weights that are whole blocks:
    # dims divide BLOCK.
    import torch
    import transformers

    config = QWEN3.replace(hidden_dim=24, intermediate_dim=48)
    fp8_checkpoint(tmp_path, config, seed=3)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    # The dequantized weights come out float32; the tensors stored in bfloat16 stay so (a
    # quantized model keeps the unconverted modules' dtype): upcast them, exactly.
    assert theirs.model.layers[0].mlp.up_proj.weight.dtype == torch.float32
    theirs = theirs.float().eval()
    tokens = (np.arange(3 * 13).reshape(3, 13) * 7 + 2) % config.vocab_size
    with torch.no_grad():
        want = theirs(torch.from_numpy(tokens)).logits.numpy()
    ours, _ = hf.load(tmp_path, dtype=jnp.float32)
    got = np.asarray(jax.jit(lambda m, t: m(t).array)(ours, tokens))
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    assert np.abs(want).max() > 0.1  # not a degenerate model


def test_save_writes_a_plain_checkpoint_that_loads_back_equal(tmp_path):
    fp8_checkpoint(tmp_path / "fp8", QWEN3)
    model, _ = hf.load(tmp_path / "fp8")
    hf.save(model, None, tmp_path / "out", max_shard_bytes=20_000)
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert "quantization_config" not in written and written["dtype"] == "bfloat16"
    stored = _safetensors.read_all(tmp_path / "out")
    assert not [k for k in stored if k.endswith(SCALE)]
    assert {t.dtype for t in stored.values()} == {BF16}
    again, _ = hf.load(tmp_path / "out")
    _assert_state(again, hf.state_dict(model))


QUANT_ERRORS = [
    ({"quant_method": "gptq", "bits": 4}, r"quant_method='gptq'"),
    ({"quant_method": "awq", "bits": 4}, r"quant_method='awq'"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, r"quant_method='bitsandbytes'"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, r"weight_block_size=None"),
    ({"quant_method": "fp8", "weight_block_size": [128]}, r"weight_block_size=\[128\]"),
    (
        {"quant_method": "fp8", "weight_block_size": [8, 12], "activation_scheme": "static"},
        r"activation_scheme='static'",
    ),
]


@pytest.mark.parametrize("quantization, names", QUANT_ERRORS)
def test_other_quantizations_are_refused_naming_key_value_and_fix(quantization, names, tmp_path):
    fp8_checkpoint(tmp_path, QWEN3)
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(json.loads(path.read_text()) | {"quantization_config": quantization})
    )
    pattern = rf"quantization_config\.{names}.*Fix: load the unquantized"
    with pytest.raises(mm.HfConfigError, match=pattern):
        hf.load(tmp_path)
    with pytest.raises(mm.HfConfigError, match=pattern):  # also with the config given
        hf.load(tmp_path, config=QWEN3)


def test_a_float8_weight_without_its_scale_is_an_error_naming_it(tmp_path):
    tensors = fp8_checkpoint(tmp_path, QWEN3)
    key = "model.layers.2.self_attn.o_proj.weight"
    del tensors[key.removesuffix(".weight") + SCALE]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(hf.CheckpointError, match=rf"{key} is float8_e4m3fn .* no {key}_scale_inv"):
        hf.load(tmp_path)


def test_scales_without_a_quantization_config_are_an_error_with_the_fix(tmp_path):
    fp8_checkpoint(tmp_path, QWEN3)
    path = tmp_path / "config.json"
    hf_config = json.loads(path.read_text())
    del hf_config["quantization_config"]
    path.write_text(json.dumps(hf_config))
    with pytest.raises(hf.CheckpointError, match=r"block scales .* Fix: add \"quantization_conf"):
        hf.load(tmp_path)


def test_a_scale_of_the_wrong_block_grid_is_an_error(tmp_path):
    fp8_checkpoint(tmp_path, QWEN3, weight_block_size=[12, 8])
    with pytest.raises(hf.CheckpointError, match=r"weight_scale_inv has shape .* blocks of \[12"):
        hf.load(tmp_path)


def test_each_tensor_and_its_scale_are_read_once_holding_one_tensor_at_a_time(
    tmp_path, monkeypatch
):
    # Big enough that a whole tensor in float32 (which dequantizing a whole tensor or layer
    # stack at once would hold, with the scales expanded to its shape) stands out of the noise.
    config = QWEN3.replace(hidden_dim=256, intermediate_dim=1000, num_layers=2)
    tensors = fp8_checkpoint(tmp_path / "fp8", config)
    sharded = dict(mesh=partitioning.make_mesh({"data": 8}), axis_mapping={"embed": "data"})
    model, _ = hf.load(tmp_path / "fp8", **sharded)
    hf.save(model, None, tmp_path / "plain")  # the same values, stored in bfloat16
    del model
    reads, scale_reads = [], []
    read_rows, read = _safetensors.Checkpoint.read_rows, _safetensors.Checkpoint.read

    def counting_rows(self, name, start=0, stop=None):
        reads.append(name)
        return read_rows(self, name, start, stop)

    def counting(self, name, index=()):
        scale_reads.append((name, index))
        return read(self, name, index)

    monkeypatch.setattr(_safetensors.Checkpoint, "read_rows", counting_rows)
    monkeypatch.setattr(_safetensors.Checkpoint, "read", counting)

    def transient(directory) -> int:
        """Host memory an unsharded load (one piece: the whole tensor) allocates beyond what
        it keeps (the parameters)."""
        hf.load(directory)  # compiles, fills caches
        tracemalloc.start()
        kept = hf.load(directory)
        held, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        del kept
        return peak - held

    plain = transient(tmp_path / "plain")
    fp8 = transient(tmp_path / "fp8")
    reads.clear(), scale_reads.clear()
    hf.load(tmp_path / "fp8", **sharded)
    scales = sorted(k for k in tensors if k.endswith(SCALE))
    # Eight devices hold pieces of each tensor; it is read once, and so is its scale, all of
    # its row blocks (one process needs every row here).
    assert sorted(reads) == sorted(k for k in tensors if not k.endswith(SCALE))
    assert sorted(scale_reads) == [(k, (slice(0, tensors[k].shape[0]),)) for k in scales]
    # Beyond a bfloat16 load's own transients (the largest tensor's rows): the dequantized
    # tensor in bfloat16, not in float32 nor its scales expanded to its shape.
    largest = max(t.size for k, t in tensors.items() if _is_quantized(k))
    assert fp8 - plain < 2 * largest + 64 * 1024, (fp8, plain, largest)
