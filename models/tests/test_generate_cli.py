"""A short real run of the `generate` binary on a tiny checkpoint with a local tokenizer."""

import json

import generate
import model_testing as T
from tokenizers import Tokenizer, models, pre_tokenizers

import meltemi.models as mm
from meltemi.models import hf


def _checkpoint(tmp_path):
    vocab = {f"w{i}": i for i in range(64)} | {"<unk>": 64, "<s>": 65, "</s>": 66}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    tok.save(str(tok_dir / "tokenizer.json"))
    (tok_dir / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    cfg = mm.get_preset("tiny-llama")
    hf.save(T.random_model(cfg, seed=2), cfg, tmp_path / "ckpt", tokenizer=tok_dir)
    return tmp_path / "ckpt"


def test_generate_binary_prints_one_json_line_per_prompt(tmp_path, capsys):
    ckpt = _checkpoint(tmp_path)
    code = generate.main(
        [f"--checkpoint={ckpt}", "--prompt=w1 w2 w3", "--prompt_ids=4,5", "--max_new_tokens=5"]
    )
    assert code == 0
    assert generate._eos(ckpt, hf.load_config(ckpt)) == 66  # the tokenizer's, not the config's 2
    lines = [json.loads(x) for x in capsys.readouterr().out.strip().splitlines()]
    assert [x["prompt_ids"] for x in lines] == [[1, 2, 3], [4, 5]]
    for x in lines:
        out = x["completion_ids"]
        assert 1 <= len(out) <= 5 and (len(out) == 5 or out[-1] == 66)  # stops on </s>
        assert isinstance(x["completion"], str)


def test_text_prompt_without_a_tokenizer_is_refused(tmp_path, capsys):
    cfg = mm.get_preset("tiny-llama")
    hf.save(T.random_model(cfg, seed=2), cfg, tmp_path)
    assert generate.main([f"--checkpoint={tmp_path}", "--prompt=hello"]) == 2
    assert "pass --prompt_ids" in capsys.readouterr().err


def test_a_bfloat16_cache_and_an_eos_list_from_generation_config(tmp_path, capsys):
    ckpt = _checkpoint(tmp_path)
    gen = json.loads((ckpt / "generation_config.json").read_text())
    (ckpt / "generation_config.json").write_text(json.dumps(gen | {"eos_token_id": [66, 65]}))
    argv = [f"--checkpoint={ckpt}", "--prompt_ids=4,5", "--max_new_tokens=6"]
    assert generate.main(argv) == 0
    assert generate.main([*argv, "--cache_dtype=bfloat16"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.strip().splitlines()]
    assert lines[0]["completion_ids"] == lines[1]["completion_ids"]
    out = lines[0]["completion_ids"]
    assert not set(out[:-1]) & {65, 66} and (len(out) == 6 or out[-1] in (65, 66))
