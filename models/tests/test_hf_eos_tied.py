"""eos lists are kept end to end (config.json, generation_config.json, generation stops), and
tied checkpoints that also store `lm_head.weight` load when it equals the embedding."""

import json

import hf_harness as H
import model_testing as T
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import meltemi.models as mm
from meltemi.models import hf


def _hf_checkpoint(tmp_path, name="tiny-llama", **config_changes):
    torch_model = H.random_hf_model(name, seed=8)
    for k, v in config_changes.items():
        setattr(torch_model.config, k, v)
    return torch_model, H.save_hf(torch_model, tmp_path)


def test_eos_list_of_config_json_is_kept_as_a_tuple():
    d = mm.to_hf_config(mm.get_preset("tiny-llama"))
    d["eos_token_id"] = [2, 5, 9]
    cfg = mm.from_hf_config(d)
    assert cfg.eos_token_id == (2, 5, 9) and cfg.eos_ids == (2, 5, 9)
    assert mm.to_hf_config(cfg)["eos_token_id"] == [2, 5, 9]
    assert mm.ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_generation_config_eos_list_is_read_and_written_back(tmp_path):
    torch_model, directory = _hf_checkpoint(tmp_path / "hf")
    gen = json.loads((directory / "generation_config.json").read_text())
    gen["eos_token_id"] = [2, 30, 41]  # config.json keeps its single id, as Llama 3 does
    (directory / "generation_config.json").write_text(json.dumps(gen))
    model, cfg = hf.load(directory)
    assert cfg.eos_token_id == (2, 30, 41)
    hf.save(model, None, tmp_path / "ours")
    written = json.loads((tmp_path / "ours" / "generation_config.json").read_text())
    assert written["eos_token_id"] == [2, 30, 41]
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["eos_token_id"] == [
        2,
        30,
        41,
    ]
    assert hf.load_config(tmp_path / "ours").eos_token_id == (2, 30, 41)


def test_generation_stops_on_any_eos_of_the_config(tmp_path):
    cfg = mm.get_preset("tiny-llama")
    model = T.random_model(cfg, seed=2)
    prompts = [[3, 17, 29, 4], [5, 60]]
    free = mm.generate(model, prompts, max_new_tokens=8, eos_token_id=None)
    eos = (free[0][2], free[1][4])
    # Same seed and sizes: the same weights, only the config's eos differs.
    with_eos = T.random_model(cfg.replace(eos_token_id=eos), seed=2)
    stopped = mm.generate(with_eos, prompts, max_new_tokens=8)
    for row, free_row in zip(stopped, free, strict=True):
        cut = next(i + 1 for i, t in enumerate(free_row) if t in eos)
        assert row == free_row[:cut]


def _tied_checkpoint(tmp_path):
    cfg = mm.get_preset("tiny-gemma")  # tied
    model = T.random_model(cfg, seed=3)
    hf.save(model, cfg, tmp_path)
    tensors = {}
    for f in tmp_path.glob("*.safetensors"):
        tensors.update(load_file(f))
    return model, tensors


def _rewrite(tmp_path, tensors):
    (tmp_path / "model.safetensors.index.json").unlink(missing_ok=True)
    for f in tmp_path.glob("*.safetensors"):
        f.unlink()
    save_file(tensors, tmp_path / "model.safetensors")


def test_tied_checkpoint_with_an_equal_lm_head_loads(tmp_path):
    model, tensors = _tied_checkpoint(tmp_path)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].copy()
    _rewrite(tmp_path, tensors)
    loaded, cfg = hf.load(tmp_path)
    assert cfg.tie_embeddings
    np.testing.assert_array_equal(np.asarray(loaded.embed.weight.array), tensors["lm_head.weight"])
    # and transformers agrees on the logits of the same files
    tokens = np.arange(11)[None] % 67
    np.testing.assert_allclose(
        np.asarray(loaded(tokens).array), H.hf_logits(H.load_hf(tmp_path), tokens), atol=1e-4
    )


def test_tied_checkpoint_with_a_different_lm_head_names_the_tensor(tmp_path):
    _, tensors = _tied_checkpoint(tmp_path)
    head = tensors["model.embed_tokens.weight"].copy()
    head[40] += 1.0
    tensors["lm_head.weight"] = head
    _rewrite(tmp_path, tensors)
    with pytest.raises(hf.CheckpointError, match=r"lm_head.weight differs from model.embed_tokens"):
        hf.load(tmp_path)
