"""Parity with `transformers` on the CPU in float32, both directions, for every family.

Models are tiny and random, built locally from configs (never downloaded).
"""

import json

import equinox as eqx
import hf_harness as H
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from hf_configs import reference_config
from safetensors.numpy import load_file, save_file

import meltemi.models as mm
from meltemi.models import hf

FAMILIES = [
    "tiny-llama",
    "tiny-llama3",
    "tiny-qwen3",
    "tiny-mixtral",
    "tiny-qwen3-moe",
    "tiny-gpt2",
    "tiny-gemma",
]
TOKENS = (np.arange(3 * 13).reshape(3, 13) * 7 + 2) % 67  # batch 3, seq 13, vocab 67
TOL = 1e-4


@eqx.filter_jit
def _logits(model, tokens):
    return model(tokens).array


def _all_tensors(directory):
    out = {}
    for f in sorted(directory.glob("*.safetensors")):
        out.update(load_file(f))
    return out


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request, tmp_path_factory):
    """(preset, HF model, its checkpoint dir, our model loaded from it)."""
    name = request.param
    cfg = mm.get_preset(name)
    torch_model = H.random_hf_model(name)
    directory = H.save_hf(torch_model, tmp_path_factory.mktemp(name))
    model, loaded_cfg = hf.load(directory)
    assert loaded_cfg == cfg
    return name, torch_model, directory, model


def test_logits_match_transformers_for_its_checkpoint(pair):
    _, torch_model, _, model = pair
    np.testing.assert_allclose(
        np.asarray(_logits(model, TOKENS)), H.hf_logits(torch_model, TOKENS), atol=TOL, rtol=0
    )


def test_transformers_loads_our_sharded_checkpoint_with_our_logits(pair, tmp_path):
    name, _, _, model = pair
    # Perturb every parameter so norms and biases are not at their initial values.
    rng = np.random.default_rng(3)
    leaves, treedef = jax.tree.flatten(model)
    leaves = [np.asarray(x) + 0.1 * rng.standard_normal(x.shape, np.float32) for x in leaves]
    ours = jax.tree.unflatten(treedef, [jnp.asarray(x) for x in leaves])
    files = hf.save(ours, None, tmp_path, max_shard_bytes=30_000)
    assert sum(f.endswith(".safetensors") for f in files) > 1, "expected several shards"
    assert (tmp_path / "model.safetensors.index.json").exists()
    reloaded = H.load_hf(tmp_path)
    np.testing.assert_allclose(
        H.hf_logits(reloaded, TOKENS), np.asarray(_logits(ours, TOKENS)), atol=TOL, rtol=0
    )


def test_round_trip_through_our_save_is_bit_exact(pair, tmp_path):
    _, _, directory, model = pair
    hf.save(model, None, tmp_path)
    theirs, ours = _all_tensors(directory), _all_tensors(tmp_path)
    assert sorted(theirs) == sorted(ours)
    for k in theirs:
        np.testing.assert_array_equal(theirs[k], ours[k], err_msg=k)
    again, _ = hf.load(tmp_path)
    for a, b in zip(jax.tree.leaves(model), jax.tree.leaves(again), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _config_differences(ours: dict, theirs: dict, ignore: tuple[str, ...] = ()) -> dict:
    keys = (set(ours) | set(theirs)) - set(ignore)
    missing = "<absent>"
    return {
        k: (ours.get(k, missing), theirs.get(k, missing))
        for k in sorted(keys)
        if ours.get(k, missing) != theirs.get(k, missing)
    }


def test_saved_config_equals_the_reference_config_on_every_key(pair, tmp_path):
    name, _, directory, model = pair
    hf.save(model, None, tmp_path)
    ours = transformers.AutoConfig.from_pretrained(tmp_path).to_dict()
    # `directory` was written by transformers from the literal config of hf_configs.py.
    theirs = transformers.AutoConfig.from_pretrained(directory).to_dict()
    assert _config_differences(ours, theirs, ignore=("_name_or_path",)) == {}


@pytest.mark.parametrize("name", mm.list_presets())
def test_exported_config_equals_the_reference_config_on_every_key(name):
    d = mm.to_hf_config(mm.get_preset(name))
    ours = transformers.AutoConfig.for_model(d.pop("model_type"), **d).to_dict()
    theirs = reference_config(name).to_dict()
    # `dtype` is the stored tensors' (set by save); the references leave it unset.
    assert _config_differences(ours, theirs, ignore=("dtype",)) == {}


def test_greedy_generation_matches_transformers_generate(tmp_path):
    torch_model = H.random_hf_model("tiny-llama", seed=5)
    model, _ = hf.load(H.save_hf(torch_model, tmp_path))
    prompt = [3, 17, 29, 4, 41]
    with torch.no_grad():
        ref = torch_model.generate(
            torch.tensor([prompt]),
            max_new_tokens=7,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
    assert mm.generate(model, [prompt], max_new_tokens=7, eos_token_id=None)[0] == ref


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return H.save_hf(H.random_hf_model("tiny-llama"), tmp_path_factory.mktemp("l"))


def test_warm_start_llama_into_qwen3_sets_new_qk_norms_to_one(llama_dir):
    qwen = mm.get_preset("tiny-qwen3")
    model, report = hf.warm_start(llama_dir, qwen)
    norm_keys = {k for k in report.initialized}
    assert norm_keys == {
        f"model.layers.{i}.self_attn.{n}_norm.weight" for i in range(3) for n in "qk"
    }
    assert set(report.initialized.values()) == {"1"}
    assert not report.missing and not report.unexpected
    np.testing.assert_array_equal(np.asarray(model.blocks.stacked.attn.q_norm.weight.array), 1.0)
    llama, _ = hf.load(llama_dir)
    np.testing.assert_array_equal(
        np.asarray(model.blocks.stacked.attn.q_proj.weight.array),
        np.asarray(llama.blocks.stacked.attn.q_proj.weight.array),
    )


def test_exact_load_across_architectures_names_the_missing_keys(llama_dir):
    with pytest.raises(hf.CheckpointError, match=r"model\.layers\.0\.self_attn\.q_norm\.weight"):
        hf.load(llama_dir, config=mm.get_preset("tiny-qwen3"))


def test_warm_start_lists_unexpected_keys(tmp_path):
    qwen_dir = H.save_hf(H.random_hf_model("tiny-qwen3"), tmp_path)
    _, report = hf.warm_start(qwen_dir, mm.get_preset("tiny-llama"))
    assert len(report.unexpected) == 6 and all("_norm" in k for k in report.unexpected)
    assert "unexpected (not loaded)" in str(report)


def _tiny_tokenizer(eos: str):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(60)} | {"<unk>": 60, "<s>": 61, eos: 62}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=eos, bos_token="<s>", unk_token="<unk>"
    )


def test_generation_config_takes_eos_from_the_tokenizer(llama_dir, tmp_path):
    model, cfg = hf.load(llama_dir)
    assert cfg.eos_token_id == 2
    hf.save(model, cfg, tmp_path, tokenizer=_tiny_tokenizer("<|end|>"))
    generation = json.loads((tmp_path / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 62
    assert transformers.GenerationConfig.from_pretrained(tmp_path).eos_token_id == 62
    assert transformers.AutoTokenizer.from_pretrained(tmp_path).eos_token_id == 62
    assert hf.load_config(tmp_path).eos_token_id == 62


def test_tokenizer_directory_gives_the_eos_id(tmp_path):
    _tiny_tokenizer("</s>").save_pretrained(tmp_path / "tok")
    assert hf.eos_token_id_of(tmp_path / "tok") == 62


def test_bfloat16_checkpoint_loads_in_transformers(llama_dir, tmp_path):
    model, cfg = hf.load(llama_dir)
    hf.save(model, cfg, tmp_path, dtype=jnp.bfloat16)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert reloaded.dtype == torch.bfloat16
    ours, _ = hf.load(tmp_path)
    assert ours.embed.weight.dtype == jnp.bfloat16


def test_original_gpt2_layout_loads_and_reports_its_mask_buffers(tmp_path):
    cfg = mm.get_preset("tiny-gpt2")
    source = H.save_hf(H.random_hf_model("tiny-gpt2"), tmp_path / "hf")
    tensors = {k.removeprefix("transformer."): v for k, v in _all_tensors(source).items()}
    tensors["h.0.attn.bias"] = np.tril(np.ones((1, 1, 64, 64), np.float32))  # old causal mask
    (tmp_path / "old").mkdir()
    save_file(tensors, tmp_path / "old" / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "old" / "config.json").write_text((source / "config.json").read_text())
    _, report = hf.warm_start(tmp_path / "old", cfg)
    assert report.exact and report.ignored == ("transformer.h.0.attn.bias",)  # normalised name
