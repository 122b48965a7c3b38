"""Chat data in the config (`data.source="chat"`, chat mixture components, the chat keys):
checked at load, one line naming the key, the value and the fix; and the chat set's store,
rows and evaluation (loss and bytes on the assistant's tokens only)."""

import json
import pathlib

import _subprocess
import numpy as np
import pytest
from _one_error import one_error_line

import meltemi.data as md
from meltemi.data import chat as mdc
from meltemi.levanter.config import ConfigError, InertKeyError, load_config, resolve
from meltemi.levanter.evaluation import fixed_eval_set, open_store

CONFIGS = pathlib.Path(__file__).parent.parent / "configs"
CHAT = CONFIGS / "sft_data"
SMOKE = f"{CONFIGS / 'default.py'}:smoke"
CHAT_KEYS = [
    ("data.source", "chat"),
    ("data.train_files", repr((str(CHAT / "train.jsonl"),))),
    ("data.validation_files", repr((str(CHAT / "validation.jsonl"),))),
]
TEMPLATE = ("data.chat_template", str(CHAT / "template.jinja"))


def _spec(*overrides):
    return resolve(load_config(SMOKE, list(overrides)))


def _hf_tokenizer(directory: pathlib.Path, template: str | None) -> pathlib.Path:
    """A tiny byte-level BPE tokenizer.json (+ tokenizer_config.json with `template`)."""
    directory.mkdir(parents=True, exist_ok=True)
    md.train_bpe(["spell: kalo k-a-l-o"] * 50, 270, directory / "tokenizer.json")
    config = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}
    if template is not None:
        config["chat_template"] = template
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory / "tokenizer.json"


def test_chat_source_renders_train_and_validation_files_with_the_template_file():
    spec = _spec(*CHAT_KEYS, TEMPLATE)
    assert isinstance(spec.data.train, mdc.ChatFiles)
    assert spec.data.train.train_on == "assistant"
    ((name, validation),) = spec.data.validation
    assert name == "validation" and isinstance(validation, mdc.ChatFiles)
    text = spec.data.template.render([{"role": "user", "content": "hi"}])
    assert text == "<|user|>\nhi\n"


def test_byte_tokenizer_without_a_template_file_names_the_key_to_set():
    with pytest.raises(
        ConfigError,
        match=r"data.tokenizer='byte' has no chat template.*"
        r"--config.data.chat_template=levanter/configs/sft_data/template.jinja",
    ):
        _spec(*CHAT_KEYS)


def test_hf_tokenizer_without_a_chat_template_names_the_key_to_set(tmp_path):
    tokenizer = _hf_tokenizer(tmp_path / "tok", template=None)
    with pytest.raises(ConfigError, match=r"data.tokenizer=.*tokenizer.json.*data.chat_template"):
        _spec(*CHAT_KEYS, ("data.tokenizer", str(tokenizer)))


def test_hf_tokenizer_uses_its_own_chat_template_and_a_file_replaces_it(tmp_path):
    own = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
    tokenizer = _hf_tokenizer(tmp_path / "tok", template=own)
    spec = _spec(*CHAT_KEYS, ("data.tokenizer", str(tokenizer)))
    assert spec.data.template.render([{"role": "user", "content": "x"}]) == "[user]x"
    spec = _spec(*CHAT_KEYS, ("data.tokenizer", str(tokenizer)), TEMPLATE)
    assert spec.data.template.render([{"role": "user", "content": "x"}]) == "<|user|>\nx\n"


def test_a_missing_template_file_is_refused_with_the_key():
    with pytest.raises(ConfigError, match=r"data.chat_template='nope.jinja': no such file"):
        _spec(*CHAT_KEYS, ("data.chat_template", "nope.jinja"))


@pytest.mark.parametrize(
    "key, value",
    [("data.train_on", "all"), ("data.overlong", "truncate"),
     ("data.loss_average", "conversation"), TEMPLATE],
)  # fmt: skip
def test_chat_keys_without_chat_data_are_inert(key, value):
    with pytest.raises(InertKeyError, match=rf"{key}=.* has no effect with data.source='stdlib'"):
        _spec((key, value))


def test_text_packing_is_inert_with_chat_data():
    with pytest.raises(
        InertKeyError,
        match=r"data.packing='whole_documents' has no effect with data.source='chat': "
        r"conversations are always packed whole.*Drop data.packing",
    ):
        _spec(*CHAT_KEYS, TEMPLATE, ("data.packing", "whole_documents"))
    assert _spec(*CHAT_KEYS, TEMPLATE).data.packing == "stream"


def test_chat_source_needs_train_files():
    with pytest.raises(ConfigError, match=r"data.source='chat' needs data.train_files"):
        _spec(("data.source", "chat"), TEMPLATE)


def test_chat_components_mix_with_text_components():
    config = load_config(SMOKE, [TEMPLATE]).config
    with config.unlocked():
        config.data.source = "mixture"
        config.data.components.chat = {
            "source": f"chat:{CHAT / 'train.jsonl'}", "weight": 0.5,
            "validation": f"chat:{CHAT / 'validation.jsonl'}",
        }  # fmt: skip
        config.data.components.code = {"source": "stdlib:train", "weight": 0.5}
    spec = resolve(config)
    sources = {c.name: c for c in spec.data.mixture.components}
    assert isinstance(sources["chat"].source, mdc.ChatFiles)
    assert isinstance(sources["chat"].validation, mdc.ChatFiles)
    assert not isinstance(sources["code"].source, mdc.ChatFiles)


def test_a_chat_component_without_paths_is_refused():
    config = load_config(SMOKE, [TEMPLATE]).config
    with config.unlocked():
        config.data.source = "mixture"
        config.data.components.chat = {"source": "chat:", "weight": 1.0}
    with pytest.raises(ConfigError, match=r"data.components.chat.source='chat:'.*chat:PATHS"):
        resolve(config)


def test_the_binary_prints_one_error_line_for_a_missing_chat_template(tmp_path):
    proc = _subprocess.run(
        tmp_path / "run", tmp_path / "cache", *(f"--config.{k}={v}" for k, v in CHAT_KEYS)
    )
    assert proc.returncode == 2
    line = one_error_line(proc.stderr)
    assert line.startswith("error: data.tokenizer='byte' has no chat template")
    assert "data.chat_template" in line


def test_chat_eval_set_counts_only_the_assistant_tokens(tmp_path):
    spec = _spec(*CHAT_KEYS, TEMPLATE, ("data.cache_dir", str(tmp_path)))
    ((_, source),) = spec.data.validation
    store = open_store(tmp_path / "val", source, spec.tokenizer)
    eval_set = fixed_eval_set("validation", store, spec.tokenizer, 64, 4, 2)
    conversations, reply_bytes = 0, 0
    for batch in eval_set.batches:
        for row in range(batch["tokens"].shape[0]):
            segments = batch["segment_ids"][row]
            for seg in np.unique(segments[segments > 0]):
                at = segments == seg
                tokens, mask = batch["tokens"][row][at], batch["loss_mask"][row][at] > 0
                trained = batch["targets"][row][at][mask]
                # The reply is what follows the assistant header: its bytes and the eos
                # carry loss, nothing else (the header, the user turn, the newline after).
                text = bytes(t for t in tokens.tolist() if t < 256).decode()
                reply = text.split("<|assistant|>\n", 1)[1].rstrip("\n")
                assert trained.tolist() == [*reply.encode(), spec.tokenizer.eos_id]
                conversations += 1
                reply_bytes += len(reply.encode())
    assert conversations == 8  # 2 batches of 4 rows, one 40-60 byte chat in each 64-byte row
    assert eval_set.num_bytes == reply_bytes  # bits per byte over the replies' bytes only


def test_bad_chat_rows_are_counted_per_reason_and_the_run_trains_on_the_rest(tmp_path):
    good = {"messages": [{"role": "user", "content": "spell: ab"},
                         {"role": "assistant", "content": "a-b"}]}  # fmt: skip
    rows = [json.dumps(good)] * 6 + [
        '{"nomessages": 1}',  # line 7
        json.dumps({"messages": [{"role": "robot", "content": "x"}]}),
        "{not json",
        json.dumps({"messages": [{"role": "user", "content": "no reply"}]}),
    ]
    (tmp_path / "chat.jsonl").write_text("\n".join(rows) + "\n")
    proc = _subprocess.run(
        tmp_path / "run",
        tmp_path / "cache",
        *(f"--config.{k}={v}" for k, v in CHAT_KEYS[:1]),
        f"--config.data.train_files={(str(tmp_path / 'chat.jsonl'),)!r}",
        f"--config.data.chat_template={TEMPLATE[1]}",
        "--config.eval.num_batches=0",
        "--config.data.seq_len=64",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if "skipped" in x)
    assert "skipped 4 inputs (malformed_json 1, no_assistant_tokens 1, no_messages 1, " in line
    assert "unknown_role 1; e.g. " in line and "chat.jsonl:" in line
    assert "6 documents kept" in line
    assert "run finished: step 2/2" in proc.stdout


def test_a_store_of_preference_pairs_is_refused_by_supervised_training(tmp_path):
    from meltemi.levanter.trainer._data import packed

    spec = _spec(*CHAT_KEYS, TEMPLATE)
    row = {
        "prompt": [{"role": "user", "content": "spell kalo"}],
        "chosen": [{"role": "assistant", "content": "k-a-l-o"}],
        "rejected": [{"role": "assistant", "content": "kalo"}],
    }
    (tmp_path / "p.jsonl").write_text(json.dumps(row) + "\n")
    pairs = mdc.PreferenceFiles("p", [str(tmp_path / "p.jsonl")], template=spec.data.template)
    store = md.build_store([pairs], md.ByteTokenizer(), tmp_path / "store")
    assert store.is_preference
    with pytest.raises(ConfigError, match=r"holds preference pairs .* data.train_files"):
        packed(spec, store)
