"""`hf.save` / `hf.load` on object storage (`gs://`, `s3://`), against a local stand-in.

The stand-in is an fsspec filesystem registered for the `gs`/`gcs`/`s3` protocols over a temp
directory (what `gcsfs`/`s3fs` are in production), so the code path is the one a bucket
takes: `etils.epath` for the JSON files, fsspec ranged reads (`cat_file(path, start, end)`)
for tensors. It records every ranged read, so the tests can see that loading reads slices.
"""

import collections
import math
import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)

import fsspec  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from fsspec.implementations.dirfs import DirFileSystem  # noqa: E402
from fsspec.implementations.local import LocalFileSystem  # noqa: E402
from model_testing import store_tied_head  # noqa: E402

import meltemi.haliax as hax  # noqa: E402
import meltemi.models as mm  # noqa: E402
from meltemi.haliax import partitioning  # noqa: E402
from meltemi.models import hf  # noqa: E402
from meltemi.models.hf import _safetensors, _storage  # noqa: E402

_ROOT = "MELTEMI_TEST_BUCKET_ROOT"
READS: list[tuple[str, int, int]] = []


class FakeBucket(DirFileSystem):
    """`gs://BUCKET/KEY` (or `s3://...`) as `$MELTEMI_TEST_BUCKET_ROOT/BUCKET/KEY`."""

    protocol = ("gs", "gcs", "s3")

    def __init__(self, *args, **kwargs):
        del args, kwargs
        super().__init__(path=os.environ[_ROOT], fs=LocalFileSystem(auto_mkdir=True))

    @classmethod
    def _strip_protocol(cls, path):
        path = path[0] if isinstance(path, list) else path
        for prefix in ("gs://", "gcs://", "s3://"):
            if path.startswith(prefix):
                path = path[len(prefix) :]
        return path.rstrip("/")

    def _join(self, path):
        if isinstance(path, str):
            path = self._strip_protocol(path)
        elif isinstance(path, list):
            path = [self._strip_protocol(p) for p in path]
        return super()._join(path)

    def cat_file(self, path, start=None, end=None, **kwargs):
        data = super().cat_file(path, start=start, end=end, **kwargs)
        READS.append((self._strip_protocol(path), start or 0, len(data)))
        return data


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    # One root per module: fsspec and epath cache filesystem instances per protocol.
    root = tmp_path_factory.mktemp("bucket")
    old = os.environ.get(_ROOT)
    os.environ[_ROOT] = str(root)
    for name in FakeBucket.protocol:
        fsspec.register_implementation(name, FakeBucket, clobber=True)
    FakeBucket.clear_instance_cache()
    yield root
    if old is None:
        del os.environ[_ROOT]
    else:
        os.environ[_ROOT] = old


@pytest.fixture(scope="module")
def model():
    return mm.init(mm.get_preset("tiny-llama"), key=jax.random.key(0))


@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_save_and_load_round_trip_through_a_bucket(model, bucket, scheme):
    url = f"{scheme}://my-bucket/{scheme}-ckpt"
    files = hf.save(model, None, url, max_shard_bytes=40_000)
    assert (bucket / "my-bucket" / f"{scheme}-ckpt" / "config.json").exists()
    shards = [f for f in files if f.endswith(".safetensors")]
    assert len(shards) > 1 and all(
        (bucket / "my-bucket" / f"{scheme}-ckpt" / f).exists() for f in shards
    )
    loaded, config = hf.load(url)
    assert config == model.config
    for ours, theirs in zip(jax.tree.leaves(model), jax.tree.leaves(loaded), strict=True):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


def test_a_bucket_checkpoint_is_read_in_slices(model, bucket):
    hf.save(model, None, "gs://b/ckpt", max_shard_bytes=40_000)
    READS.clear()
    ckpt = _safetensors.Checkpoint("gs://b/ckpt")
    header_reads = len(READS)
    name = "model.layers.1.mlp.down_proj.weight"
    info = ckpt.tensors[name]
    rows = ckpt.read(name, (slice(3, 7),))
    whole = _safetensors.Checkpoint(str(bucket / "b" / "ckpt")).read(name)
    np.testing.assert_array_equal(rows, whole[3:7])
    # One ranged read of exactly the 4 rows asked for.
    assert [r[2] for r in READS[header_reads:]] == [4 * info.shape[1] * info.dtype.itemsize]
    # A whole load: every read is one tensor's rows, never a whole shard file, and the bytes
    # read are the tensors' bytes (nothing read twice) plus the headers.
    READS.clear()
    hf.load("gs://b/ckpt")
    reads = list(READS)
    sizes = {f.name: f.stat().st_size for f in (bucket / "b" / "ckpt").glob("*.safetensors")}
    tensor_bytes = sum(int(np.prod(t.shape)) * t.dtype.itemsize for t in ckpt.tensors.values())
    data_reads = [r for r in reads if r[2] > 8]
    assert max(r[2] for r in data_reads) < min(sizes.values())
    total = sum(r[2] for r in reads)
    assert tensor_bytes <= total <= sum(sizes.values())


def test_a_sharded_load_from_a_bucket_reads_each_tensor_once_not_per_piece(model, bucket):
    hf.save(model, None, "gs://b/mesh-ckpt", max_shard_bytes=40_000)
    ckpt = _safetensors.Checkpoint("gs://b/mesh-ckpt")
    mesh = partitioning.make_mesh({"data": 2, "model": 4})
    mapping = {"embed": "data", "mlp": "model"}
    READS.clear()
    loaded, _ = hf.load("gs://b/mesh-ckpt", mesh=mesh, axis_mapping=mapping)
    # Each data read lies inside one tensor; eight devices hold pieces of most tensors, yet
    # each tensor is fetched by exactly one ranged read of all its bytes.
    spans = {
        (info.file.name, info.start): (name, math.prod(info.shape) * info.dtype.itemsize)
        for name, info in ckpt.tensors.items()
    }
    per_tensor = collections.Counter()
    for path, start, size in READS:
        for (file, first), (name, nbytes) in spans.items():
            if path.endswith(file) and first <= start < first + max(nbytes, 1):
                assert (start, size) == (first, nbytes), name
                per_tensor[name] += 1
    assert per_tensor == dict.fromkeys(ckpt.tensors, 1)
    split = 0
    leaves = jax.tree.leaves(loaded, is_leaf=hax.is_named_array)
    for got, want in zip(leaves, jax.tree.leaves(model, is_leaf=hax.is_named_array), strict=True):
        split += not got.array.sharding.is_fully_replicated
        np.testing.assert_array_equal(np.asarray(got.array), np.asarray(want.array))
    assert split >= 4  # the mapping really splits several parameters into pieces


def test_an_unknown_scheme_names_the_package_to_install(bucket):
    with pytest.raises(_storage.StorageError, match=r"no filesystem for abfs://.*install"):
        hf.load("abfs://container/ckpt")


# -- a tied checkpoint that also stores `lm_head.weight` (issue #31, point 9) ------------------


def _tied_in_bucket(bucket, name, changed_row=None):
    """`gs://b/<name>`: a tied tiny-gemma checkpoint that also stores `lm_head.weight` (equal
    to the embedding, or with one row changed); returns its model."""
    config = mm.get_preset("tiny-gemma").replace(vocab_size=68)  # rows split 4 ways
    model = mm.init(config, key=jax.random.key(1))
    assert model.config.tie_embeddings
    local = bucket / "b" / name
    hf.save(model, None, local)
    store_tied_head(local, changed_row)
    return model


def _reads_per_tensor(ckpt):
    """Per tensor of `ckpt`: how many times its bytes were read (each read must be all of them)."""
    spans = {
        info.start: (name, math.prod(info.shape) * info.dtype.itemsize)
        for name, info in ckpt.tensors.items()
    }
    per_tensor = collections.Counter()
    for _, start, size in READS:
        for first, (name, nbytes) in spans.items():
            if first <= start < first + max(nbytes, 1):
                assert (start, size) == (first, nbytes), (name, start, size)
                per_tensor[name] += 1
    return per_tensor


def test_a_tied_checkpoint_storing_its_head_reads_each_tensor_once(bucket):
    model = _tied_in_bucket(bucket, "tied-equal")
    ckpt = _safetensors.Checkpoint("gs://b/tied-equal")
    assert "lm_head.weight" in ckpt.tensors
    mesh = partitioning.make_mesh({"data": 2, "model": 4})
    READS.clear()
    loaded, _ = hf.load("gs://b/tied-equal", mesh=mesh, axis_mapping={"vocab": "model"})
    # The head is compared with the embedding as the embedding is read: both once, like the
    # rest (before: the embedding twice, the head once, ahead of the sharded load).
    assert _reads_per_tensor(ckpt) == dict.fromkeys(ckpt.tensors, 1)
    embed = loaded.embed.weight.array
    assert embed.sharding.spec[0] == "model"  # rows split over the model axis: 4 pieces
    np.testing.assert_array_equal(np.asarray(embed), np.asarray(model.embed.weight.array))


@pytest.mark.parametrize("row", [0, 40, 67])
def test_a_tied_checkpoint_whose_head_differs_in_one_row_is_refused(bucket, row):
    _tied_in_bucket(bucket, f"tied-differs-{row}", changed_row=row)
    mesh = partitioning.make_mesh({"data": 2, "model": 4})
    with pytest.raises(
        hf.CheckpointError,
        match=rf"ties the embeddings, but the checkpoint's lm_head.weight differs from "
        rf"model.embed_tokens.weight \(first at row {row}\).*tie_word_embeddings=false",
    ):
        hf.load(f"gs://b/tied-differs-{row}", mesh=mesh, axis_mapping={"vocab": "model"})
