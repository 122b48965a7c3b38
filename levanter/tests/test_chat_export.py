"""`--export_hf` of a chat run: the tokenizer with its `chat_template`, and the eos list
(the tokenizer's eos and the template's end of turn) in `generation_config.json`, so that
`transformers` loads the export, `apply_chat_template` renders and tokenizes as Meltemi does,
and greedy `generate` stops where Meltemi's chat generation stops, with the same tokens."""

import json
import pathlib

import equinox as eqx
import jax
import numpy as np
import pytest
import tokenizers

import meltemi.data as md
from meltemi.data import chat as mdc
from meltemi.levanter.config import load_config
from meltemi.levanter.evaluation import chat_replies, prompt_of
from meltemi.levanter.trainer import Trainer

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

CONFIGS = pathlib.Path(__file__).parent.parent / "configs"
CHAT = CONFIGS / "sft_data"
# A ChatML-like template whose assistant turn ends with a special token of its own.
TEMPLATE = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>' }}{% if m['role'] == 'assistant' %}"
    "{% generation %}{{ m['content'] + '<|end|>' }}{% endgeneration %}{% else %}"
    "{{ m['content'] + '<|end|>' }}{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def _tokenizer(directory: pathlib.Path) -> pathlib.Path:
    directory.mkdir()
    texts = [line for line in (CHAT / "train.jsonl").read_text().splitlines()]
    md.train_bpe(texts, 320, directory / "tokenizer.json")
    tok = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
    tok.add_special_tokens(["<|end|>"])
    tok.save(str(directory / "tokenizer.json"))
    # No chat template of its own: the run's data.chat_template file is the one exported.
    config = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
              "tokenizer_class": "PreTrainedTokenizerFast"}  # fmt: skip
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory / "tokenizer.json"


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat_export")
    tokenizer = _tokenizer(root / "tok")
    (root / "chat.jinja").write_text(TEMPLATE)
    resolved = load_config(
        f"{CONFIGS / 'sft.py'}:smoke",
        [("run_dir", str(root / "run")), ("data.cache_dir", str(root / "cache")),
         ("data.tokenizer", str(tokenizer)), ("data.chat_template", str(root / "chat.jinja")),
         ("data.seq_len", "64"), ("checkpoint.enabled", "false")],
    )  # fmt: skip
    trainer = Trainer(resolved)
    trainer.run()
    trainer.export_hf(root / "hf")
    return trainer, root / "hf"


def test_export_writes_the_chat_template_and_the_eos_list(export):
    trainer, directory = export
    tok = trainer.spec.tokenizer
    end = int(tok.encode_with_offsets("<|end|>")[0][0])
    generation = json.loads((directory / "generation_config.json").read_text())
    assert generation["eos_token_id"] == sorted([tok.eos_id, end])
    assert json.loads((directory / "config.json").read_text())["eos_token_id"] == sorted(
        [tok.eos_id, end]
    )
    assert json.loads((directory / "tokenizer_config.json").read_text())["chat_template"] == (
        TEMPLATE
    )


def test_transformers_renders_and_tokenizes_the_export_as_meltemi(export):
    trainer, directory = export
    hf_tok = transformers.AutoTokenizer.from_pretrained(directory)
    template = trainer.spec.data.template
    messages = [{"role": "system", "content": "Spell."}, {"role": "user", "content": "spell: kalo"},
                {"role": "assistant", "content": "k-a-l-o"}]  # fmt: skip
    for prompt in (messages, messages[:2]):
        text = hf_tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        assert text == template.render(prompt, add_generation_prompt=True)
    ids = hf_tok.apply_chat_template(messages, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    ours = mdc.encode_chat(messages, trainer.spec.tokenizer, template)
    assert list(ids) == ours.ids.tolist()


def test_transformers_greedy_generate_gives_meltemis_chat_tokens(export):
    trainer, directory = export
    hf_tok = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    conversations = [json.loads(x)["messages"] for x in
                     (CHAT / "validation.jsonl").read_text().splitlines()[:3]]  # fmt: skip
    generation = json.loads((directory / "generation_config.json").read_text())
    ours = chat_replies(
        eqx.combine(jax.device_get(trainer.state.params), trainer.plan.static),
        trainer.spec.tokenizer,
        trainer.spec.data.template,
        conversations,
        eos_ids=generation["eos_token_id"],
        max_new_tokens=8,
    )
    for conversation, reply in zip(conversations, ours, strict=True):
        ids = hf_tok.apply_chat_template(prompt_of(conversation), add_generation_prompt=True,
                                         return_tensors="pt", return_dict=True)  # fmt: skip
        out = model.generate(**ids, do_sample=False, max_new_tokens=8)
        theirs = out[0, ids["input_ids"].shape[1] :].tolist()
        assert theirs == list(reply.ids)
        assert np.isin(theirs[-1:], generation["eos_token_id"]).all() == reply.stopped


def test_a_chat_run_starts_from_the_export_and_reads_its_template(export, tmp_path):
    # model.init_from_hf with data.source="chat": the export's tokenizer_config.json brings
    # the chat template (no data.chat_template), and the weights are the exported ones.
    trainer, directory = export
    resolved = load_config(
        f"{CONFIGS / 'sft.py'}:smoke",
        [("run_dir", str(tmp_path / "run")), ("data.cache_dir", str(tmp_path / "cache")),
         ("model.init_from_hf", str(directory)),
         ("data.tokenizer", str(directory / "tokenizer.json")),
         ("data.chat_template", ""), ("data.seq_len", "64"), ("checkpoint.enabled", "false"),
         ("eval.num_batches", "0")],
    )  # fmt: skip
    again = Trainer(resolved)
    assert again.spec.data.template.source == TEMPLATE
    again.run(stop_after=0)  # initialised, not trained
    for ours, theirs in zip(jax.tree.leaves(again.state.params),
                            jax.tree.leaves(trainer.state.params), strict=True):  # fmt: skip
        np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-6, atol=1e-6)
    assert Trainer(resolved).run().step == 2


def test_a_byte_level_run_exports_a_tokenizer_that_serving_and_transformers_read(tmp_path):
    # The byte tokenizer has no file of its own: the export writes one (byte b = token b), so
    # `//models:serve` (meltemi.models.chat.load_tokenizer) and `transformers` read the model.
    from meltemi.models import chat as mchat

    resolved = load_config(
        f"{CONFIGS / 'sft.py'}:smoke",
        [("run_dir", str(tmp_path / "run")), ("data.cache_dir", str(tmp_path / "cache")),
         ("checkpoint.enabled", "false"), ("eval.num_batches", "0")],
    )  # fmt: skip
    trainer = Trainer(resolved)
    assert trainer.spec.data.tokenizer == "byte"
    trainer.run(stop_after=0)  # the initial weights: the tokenizer is what is tested
    trainer.export_hf(tmp_path / "hf")
    messages = [{"role": "user", "content": "spell: kalo"},
                {"role": "assistant", "content": "k-a-l-o ☃"}]  # fmt: skip
    ours = mdc.encode_chat(messages, trainer.spec.tokenizer, trainer.spec.data.template)
    served = mchat.load_tokenizer(tmp_path / "hf")
    text = trainer.spec.data.template.render(messages)
    assert served.encode(text).tolist() == ours.ids.tolist()
    assert served.eos_id == trainer.spec.tokenizer.eos_id
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    ids = hf_tok.apply_chat_template(messages, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert list(ids) == ours.ids.tolist()
