"""`//levanter:eval`: a checkpoint's loss and bits per byte, by the trainer's own evaluator.

A two-step run evaluates itself at the end (metrics.jsonl); evaluating its final checkpoint
afterwards must give the same numbers (1e-6). Bits per byte divide by the bytes of the text
each evaluated token span decodes to, counted so that split characters count once.
"""

import json
import pathlib
import shutil
import subprocess
import sys

import _subprocess
import jax
import numpy as np
import pytest
from _subprocess import DEFAULT

from meltemi import data as md
from meltemi.levanter.config import load_config, resolve
from meltemi.levanter.evaluation import (
    EvalError,
    batch_bytes,
    evaluate_checkpoint,
    format_table,
    macro_average,
    parse_eval_files,
    span_bytes,
)
from meltemi.levanter.mesh import make_mesh
from meltemi.levanter.trainer import Trainer

EVAL = _subprocess.TRAIN.parent / "eval.py"
TEXT = "héllo wörld — ünïcödé 🙂 text, with multi-byte characters in every row. " * 3


def _rows(ids, seq_len):
    """Consecutive stream rows of `ids` (as the packed dataset cuts them), all loss tokens."""
    n = (len(ids) - 1) // seq_len
    tokens = np.stack([ids[i * seq_len : (i + 1) * seq_len] for i in range(n)])
    targets = np.stack([ids[i * seq_len + 1 : (i + 1) * seq_len + 1] for i in range(n)])
    return {"tokens": tokens, "targets": targets, "loss_mask": np.ones_like(tokens, np.float32)}


@pytest.mark.parametrize("seq_len", [5, 7, 16])
def test_bytes_of_rows_cut_inside_characters_add_up_to_the_text(seq_len):
    tok = md.ByteTokenizer()
    ids = tok.encode(TEXT)
    batch = _rows(ids, seq_len)
    covered = batch["targets"].size  # byte tokens: one per byte
    assert batch_bytes(batch, tok) == covered
    # Decoding each row on its own counts a split character as U+FFFD (3 bytes) per piece.
    naive = sum(len(tok.decode(t).encode()) for t in batch["targets"])
    assert naive != covered


def test_bytes_with_a_tokenizer_json_are_the_bytes_of_the_covered_text(tmp_path):
    import tokenizers

    chars = sorted(set(TEXT))
    vocab = {"<unk>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex("."), behavior="isolated")
    tok.decoder = tokenizers.decoders.Fuse()
    tok.add_special_tokens(["<unk>", "<eos>"])
    tok.save(str(tmp_path / "tokenizer.json"))
    hf = md.HfTokenizer(str(tmp_path / "tokenizer.json"))
    ids = hf.encode(TEXT)
    batch = _rows(ids, 7)
    covered = "".join(chars[i - 2] for i in batch["targets"].ravel())
    assert batch_bytes(batch, hf) == len(covered.encode())
    batch["loss_mask"][:, 2] = 0  # a gap in every row: two spans each
    gap = "".join(chars[i - 2] for i in batch["targets"][:, 2])
    assert batch_bytes(batch, hf) == len(covered.encode()) - len(gap.encode())


def test_spans_are_counted_separately_and_special_tokens_count_nothing():
    tok = md.ByteTokenizer()
    ids = np.concatenate([tok.encode("ab"), [tok.eos_id], tok.encode("çd")]).astype(np.int32)
    tokens, targets = ids[:-1], ids[1:]  # targets: b <eos> ç(2 bytes) d
    mask = np.ones(len(targets), np.float32)
    assert span_bytes(tokens, targets, mask, tok) == 1 + 0 + 2 + 1
    mask[1] = 0  # <eos> masked out: two spans
    assert span_bytes(tokens, targets, mask, tok) == 1 + 2 + 1
    mask[:] = 0
    assert span_bytes(tokens, targets, mask, tok) == 0


def test_macro_average_weighs_every_set_the_same():
    evals = {"big": {"loss": 1.0, "bpb": 0.5, "tokens": 1e6}, "small": {"loss": 3.0, "bpb": 1.5}}
    assert macro_average(evals) == {"loss": 2.0, "bpb": 1.0}
    table = format_table(evals)
    assert "macro average" in table and "2.0000" in table


def test_eval_files_errors_name_the_fix(tmp_path):
    (tmp_path / "a.txt").write_text("text")
    assert parse_eval_files(f"a={tmp_path / 'a.txt'}") == {"a": str(tmp_path / "a.txt")}
    with pytest.raises(EvalError, match=r"'nope' is not NAME=PATH; e.g. --eval_files=wiki="):
        parse_eval_files("nope")
    with pytest.raises(EvalError, match=r"x=.*no such file"):
        parse_eval_files(f"x={tmp_path / 'missing.jsonl'}")
    with pytest.raises(EvalError, match=r"'a' is given twice"):
        parse_eval_files(f"a={tmp_path / 'a.txt'},a={tmp_path / 'a.txt'}")
    with pytest.raises(EvalError, match=r"may use only letters"):
        parse_eval_files(f"a b={tmp_path / 'a.txt'}")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    resolved = load_config(
        f"{DEFAULT}:smoke",
        [("run_dir", str(root / "run")), ("data.cache_dir", str(root / "cache")),
         ("eval.num_batches", "2")],
    )  # fmt: skip
    trainer = Trainer(resolve(resolved), mesh=make_mesh({"data": 1}, devices=jax.devices()[:1]))
    result = trainer.run()
    extra = root / "extra.jsonl"
    extra.write_text("".join(json.dumps({"text": f"def f{i}(x):\n    return x * {i} + 'é'\n"})
                             + "\n" for i in range(40)))  # fmt: skip
    return root, trainer, result, resolved, extra


def _cache_state(cache):
    """Every file of the token-store cache with its modification time (ns)."""
    return {
        str(p.relative_to(cache)): p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()
    }


def test_the_eval_binary_reopens_the_runs_validation_store(run, tmp_path, capsys):
    """The trainer and `//levanter:eval` key a validation store the same way
    (`evaluation.cached_store`): evaluating the run's checkpoint tokenizes nothing again."""
    root, _, _, _, _ = run
    cache = root / "cache"
    before = _cache_state(cache)
    data, _ = evaluate_checkpoint(str(root / "run"), output=tmp_path / "eval.json")
    assert list(data["sets"]) == ["stdlib"]
    assert _cache_state(cache) == before  # no new store, no file rewritten
    assert "skipped" not in capsys.readouterr().out  # no build reported either
    stores = sorted({pathlib.Path(k).parts[0] for k in before})
    assert any(s.startswith("source-stdlib-") for s in stores), stores  # the one both use


def test_a_loaded_model_is_built_with_keywords(run):
    """`LoadedModel` has nine fields: built by position, two of one type could swap silently."""
    from meltemi.levanter.evaluation import LoadedModel, load_model

    root = run[0]
    loaded = load_model(str(root / "run"))
    fields = ("path", "kind", "params", "static", "tokenizer", "mesh", "compute_dtype", "spec")
    with pytest.raises(TypeError, match=r"positional argument"):
        LoadedModel(*(getattr(loaded, f) for f in fields), loaded.step)
    again = LoadedModel(**{f: getattr(loaded, f) for f in (*fields, "step")})
    assert again.step == loaded.step == 2 and again.kind == "run"


def test_the_checkpoint_evaluates_as_the_run_did(run):
    root, trainer, result, _, _ = run
    logged = json.loads((root / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    ckpt = root / "run" / "checkpoints" / "step_00000002"
    data, path = evaluate_checkpoint(str(ckpt))
    assert path == ckpt / "eval.json" and json.loads(path.read_text()) == data
    assert data["kind"] == "run" and data["step"] == 2
    assert list(data["sets"]) == ["stdlib"]
    for metric in ("loss", "bpb"):
        np.testing.assert_allclose(
            data["sets"]["stdlib"][metric], logged[f"eval/stdlib/{metric}"], rtol=1e-6, atol=0
        )
        assert data["sets"]["stdlib"][metric] == pytest.approx(result.eval["stdlib"][metric])
    assert data["macro_avg"]["loss"] == data["sets"]["stdlib"]["loss"]
    # The run directory itself means its newest checkpoint; a config saved before a key was
    # added to base_config() still resolves (the key at its default).
    saved = json.loads((root / "run" / "config.json").read_text())
    del saved["config"]["eval"]["harness_limit"]
    (root / "run" / "config.json").write_text(json.dumps(saved))
    again, _ = evaluate_checkpoint(str(root / "run"), output=root / "again.json")
    assert again["sets"] == data["sets"]


def test_extra_files_and_the_hugging_face_export_agree(run):
    root, trainer, _, resolved, extra = run
    ckpt = root / "run" / "checkpoints" / "step_00000002"
    trainer.export_hf(root / "hf")
    files = f"code={extra}"
    a, _ = evaluate_checkpoint(str(ckpt), eval_files=files, output=root / "a.json")
    assert list(a["sets"]) == ["stdlib", "code"]
    assert a["sets"]["code"]["bytes"] > 0 and np.isfinite(a["sets"]["code"]["bpb"])
    expected = (a["sets"]["stdlib"]["bpb"] + a["sets"]["code"]["bpb"]) / 2
    assert a["macro_avg"]["bpb"] == pytest.approx(expected)
    # The same weights as a Hugging Face directory (byte tokenizer: the run's config names it).
    b, path = evaluate_checkpoint(str(root / "hf"), config=resolved, eval_files=files)
    assert path == root / "hf" / "eval.json" and b["kind"] == "hf"
    for name in ("stdlib", "code"):
        np.testing.assert_allclose(b["sets"][name]["loss"], a["sets"][name]["loss"], rtol=1e-5)
    # `b` read the byte-level tokenizer.json the export wrote (it wins over the config's), so
    # equal losses mean equal ids. Without --config the export evaluates on its own files.
    c, _ = evaluate_checkpoint(str(root / "hf"), eval_files=files, output=root / "c.json")
    assert list(c["sets"]) == ["code"] and np.isfinite(c["sets"]["code"]["bpb"])
    bare = root / "hf_without_tokenizer"
    shutil.copytree(root / "hf", bare)
    (bare / "tokenizer.json").unlink()
    with pytest.raises(EvalError, match=r"no tokenizer.json .* pass a --config"):
        evaluate_checkpoint(str(bare), eval_files=files)
    with pytest.raises(EvalError, match=r"'stdlib' is already an evaluation set"):
        evaluate_checkpoint(str(ckpt), eval_files=f"stdlib={extra}")


def test_the_binary_prints_a_table_and_fails_in_one_line(run, tmp_path):
    root, *_ = run
    ckpt = root / "run" / "checkpoints" / "step_00000002"
    env = _subprocess.env()
    out = tmp_path / "eval.json"
    proc = subprocess.run(
        [sys.executable, str(EVAL), f"--checkpoint={ckpt}", f"--output={out}"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "macro average" in proc.stdout and "stdlib" in proc.stdout
    assert json.loads(out.read_text())["step"] == 2
    for args, message in [
        ([f"--checkpoint={tmp_path / 'missing'}"], "error: --checkpoint="),
        ([f"--checkpoint={ckpt}", "--eval_files=oops"], "error: --eval_files: 'oops'"),
    ]:
        bad = subprocess.run([sys.executable, str(EVAL), *args], env=env, capture_output=True,
                             text=True, timeout=600)  # fmt: skip
        assert bad.returncode == 2
        lines = bad.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(message), bad.stderr
