"""meltemi.data: a deterministic token store with Feistel permutations, mixtures and provenance.

Build a store from sources with a tokenizer, pack it into fixed-length rows, and ask for any
step's batch: it is a pure function of (store, config, seed, step).

>>> import tempfile
>>> from meltemi.data import ByteTokenizer, JsonlFiles, PackedDataset, build_store
>>> d = tempfile.mkdtemp()
>>> with open(f"{d}/a.jsonl", "w") as f:
...     _ = f.write("".join(f'{{"text": "document number {i}"}}\\n' for i in range(20)))
>>> store = build_store([JsonlFiles("a", [f"{d}/a.jsonl"])], ByteTokenizer(), f"{d}/store")
>>> ds = PackedDataset(store, seq_len=16, batch_size=4, seed=0)
>>> batch = ds.batch(3)
>>> batch["tokens"].shape, batch["loss_mask"].dtype
((4, 16), dtype('float32'))
>>> bool((ds.batch(3)["tokens"] == batch["tokens"]).all())
True
"""

from meltemi.data._build import build_store
from meltemi.data._clean import CleanPolicy, ngram_hashes, truncate_runs
from meltemi.data._dataset import (
    LOSS_AVERAGES,
    OVERLONG,
    PACKINGS,
    PackedDataset,
    Piece,
    batch_rows,
    packing_options,
)
from meltemi.data._mixture import DatasetExhausted, MixtureDataset, exact_counts
from meltemi.data._parallel import Executor, FrayExecutor, InlineExecutor, ProcessExecutor
from meltemi.data._prefetch import Prefetcher
from meltemi.data._sources import (
    Files,
    JsonlFiles,
    ParquetFiles,
    RawDocument,
    Source,
    SourceError,
    TextFiles,
    parse_source,
    stdlib_corpus,
)
from meltemi.data._store import (
    SourcesChangedError,
    StoreError,
    TokenizerMismatchError,
    TokenStore,
)
from meltemi.data._tokenizer import (
    ByteTokenizer,
    HfTokenizer,
    Tokenizer,
    TokenizerError,
    load_tokenizer,
    train_bpe,
)
from meltemi.data.permutation import (
    BlockShuffle,
    EraShuffle,
    FeistelPermutation,
    LinearPermutation,
)

__version__ = "0.1.0"

__all__ = [
    "LOSS_AVERAGES",
    "OVERLONG",
    "PACKINGS",
    "BlockShuffle",
    "ByteTokenizer",
    "CleanPolicy",
    "DatasetExhausted",
    "EraShuffle",
    "Executor",
    "FeistelPermutation",
    "Files",
    "FrayExecutor",
    "HfTokenizer",
    "InlineExecutor",
    "JsonlFiles",
    "LinearPermutation",
    "MixtureDataset",
    "PackedDataset",
    "ParquetFiles",
    "Piece",
    "Prefetcher",
    "ProcessExecutor",
    "RawDocument",
    "Source",
    "SourceError",
    "SourcesChangedError",
    "StoreError",
    "TextFiles",
    "TokenStore",
    "Tokenizer",
    "TokenizerError",
    "TokenizerMismatchError",
    "__version__",
    "batch_rows",
    "build_store",
    "exact_counts",
    "load_tokenizer",
    "ngram_hashes",
    "packing_options",
    "parse_source",
    "stdlib_corpus",
    "train_bpe",
    "truncate_runs",
]
