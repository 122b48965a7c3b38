"""Loading chat templates as transformers does, the template-file override, errors, export."""

from __future__ import annotations

import json
import pickle

import pytest
from chat_fixtures import CONVERSATIONS, LLAMA3, STYLES, TULU, hf_tokenizer

from meltemi.data.chat import ChatTemplate, ChatTemplateError

MESSAGES = CONVERSATIONS["multi_turn"]


def _config_dir(tmp_path, **config):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


def test_tokenizer_config_string_form(tmp_path):
    d = _config_dir(tmp_path, chat_template=TULU, eos_token="<|endoftext|>")
    t = ChatTemplate.from_pretrained(d)
    assert t.source == TULU
    assert t.special_tokens == {"eos_token": "<|endoftext|>"}
    assert t.render(MESSAGES[:2]).endswith("🙂<|endoftext|>")


def test_tokenizer_config_list_form_picks_default_or_name(tmp_path):
    named = [{"name": "default", "template": TULU}, {"name": "tool_use", "template": LLAMA3}]
    d = _config_dir(tmp_path, chat_template=named, bos_token={"content": "<s>", "lstrip": False})
    assert ChatTemplate.from_pretrained(d).source == TULU
    t = ChatTemplate.from_pretrained(d, name="tool_use")
    assert t.source == LLAMA3 and t.render(MESSAGES[:1]).startswith("<s><|start_header_id|>")


def test_list_form_without_default_names_the_choices(tmp_path):
    named = [{"name": "a", "template": TULU}, {"name": "b", "template": LLAMA3}]
    d = _config_dir(tmp_path, chat_template=named)
    with pytest.raises(
        ChatTemplateError, match=r"\['a', 'b'\] and no 'default'.*data.chat_template"
    ):
        ChatTemplate.from_pretrained(d)


def test_chat_template_jinja_wins_over_the_config(tmp_path):
    d = _config_dir(tmp_path, chat_template=LLAMA3)
    (d / "chat_template.jinja").write_text(TULU)
    assert ChatTemplate.from_pretrained(d).source == TULU
    (d / "additional_chat_templates").mkdir()
    (d / "additional_chat_templates" / "tool_use.jinja").write_text("{{ 'tools' }}")
    assert ChatTemplate.from_pretrained(d, name="tool_use").render([]) == "tools"


def test_template_file_replaces_the_directory_template(tmp_path):
    d = _config_dir(tmp_path / "tok", chat_template=LLAMA3, eos_token="</s>")
    f = tmp_path / "mine.jinja"
    f.write_text("{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}")
    t = ChatTemplate.from_pretrained(d, template_file=f)
    assert t.render(MESSAGES[:1]) == MESSAGES[0]["content"] + "</s>"
    assert ChatTemplate.from_pretrained(None, template_file=f).name == str(f)


def test_missing_template_names_the_config_key(tmp_path):
    d = _config_dir(tmp_path, eos_token="</s>")
    with pytest.raises(ChatTemplateError, match=r"no chat template.*set data\.chat_template"):
        ChatTemplate.from_pretrained(d)
    with pytest.raises(ChatTemplateError, match=r"data\.chat_template='.*nope.jinja'.*cannot read"):
        ChatTemplate.from_pretrained(d, template_file=tmp_path / "nope.jinja")


def test_syntax_error_names_the_template_and_line(tmp_path):
    with pytest.raises(
        ChatTemplateError, match=r"chat template t.jinja: line 2: .*data\.chat_template"
    ):
        ChatTemplate("ok\n{% for m in messages %}", name="t.jinja")


def test_transformers_loads_the_same_template_from_its_own_save(tmp_path):
    transformers = pytest.importorskip("transformers")
    style = STYLES["llama3"]
    fast = hf_tokenizer(tmp_path / "a", style, style.template)
    t = ChatTemplate.from_pretrained(tmp_path / "a")  # transformers 5 saves chat_template.jinja
    assert (tmp_path / "a" / "chat_template.jinja").exists()
    assert t.source == fast.chat_template
    assert t.special_tokens["bos_token"] == "<|begin_of_text|>"
    # save_pretrained into a directory without a template: transformers then loads ours.
    hf_tokenizer(tmp_path / "b", style, None)
    t.save_pretrained(tmp_path / "b")
    loaded = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "b"))
    assert loaded.chat_template == t.source
    assert loaded.apply_chat_template(MESSAGES, tokenize=False) == t.render(MESSAGES)


def test_save_pretrained_keeps_other_config_keys(tmp_path):
    d = _config_dir(tmp_path, model_max_length=77, eos_token="<e>")
    ChatTemplate(TULU, special_tokens={"eos_token": "<x>", "bos_token": "<b>"}).save_pretrained(d)
    config = json.loads((d / "tokenizer_config.json").read_text())
    assert config == {"model_max_length": 77, "eos_token": "<e>", "bos_token": "<b>",
                      "chat_template": TULU}  # fmt: skip


def test_pickle_round_trip_renders_the_same():
    t = ChatTemplate(LLAMA3, special_tokens={"bos_token": "<s>"})
    t2 = pickle.loads(pickle.dumps(t))
    assert t2 == t and t2.render(MESSAGES) == t.render(MESSAGES)


def test_fingerprint_changes_with_text_and_special_tokens():
    a = ChatTemplate(TULU, special_tokens={"eos_token": "</s>"})
    assert a.fingerprint() == ChatTemplate(TULU, special_tokens={"eos_token": "</s>"}).fingerprint()
    assert a.fingerprint() != ChatTemplate(TULU, special_tokens={"eos_token": "<e>"}).fingerprint()
    assert (
        a.fingerprint() != ChatTemplate(TULU + " ", special_tokens=a.special_tokens).fingerprint()
    )
