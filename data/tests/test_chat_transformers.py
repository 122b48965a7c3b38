"""Chat rendering, token ids and loss masks equal `transformers`' `apply_chat_template`.

Each template family (ChatML/Qwen2.5 with tools, Llama 3, Tulu/OLMo, Gemma) is checked on a
tokenizer trained here, against `apply_chat_template(..., return_dict=True,
return_assistant_tokens_mask=True)`: the annotated (`{% generation %}`) variant's mask is the
reference for both our tag-based mask and the mask we derive from the plain template.
"""

from __future__ import annotations

import pytest
from chat_fixtures import CONVERSATIONS, GLOBALS, STYLES, TOOLS, cases, hf_tokenizer

from meltemi.data import HfTokenizer
from meltemi.data.chat import ChatTemplate, encode_chat

pytest.importorskip("transformers")  # the reference implementation, a test-only dependency


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """style name -> (transformers tokenizer with the plain template, HfTokenizer, directory)."""
    out = {}
    for style in STYLES.values():
        d = tmp_path_factory.mktemp(style.name)
        fast = hf_tokenizer(d, style, style.template)
        out[style.name] = (fast, HfTokenizer(d, bos=style.bos or "", eos=style.eos), d)
    return out


def _tools(conversation: str):
    return TOOLS if conversation == "tool_calls" else None


@pytest.mark.parametrize("style,conversation", cases())
def test_plain_template_ids_and_derived_mask_equal_transformers(tokenizers, style, conversation):
    fast, tok, d = tokenizers[style]
    messages, tools = CONVERSATIONS[conversation], _tools(conversation)
    ref = fast.apply_chat_template(
        messages,
        tools=tools,
        chat_template=STYLES[style].annotated,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    template = ChatTemplate.from_pretrained(d)
    assert not template.has_generation_tag
    enc = encode_chat(messages, tok, template, tools=tools)
    assert enc.ids.tolist() == fast.apply_chat_template(messages, tools=tools, return_dict=False)
    assert enc.loss_mask.tolist() == ref["assistant_masks"]
    assert sum(ref["assistant_masks"]) > 0


@pytest.mark.parametrize("style,conversation", cases())
def test_generation_tag_ids_and_mask_equal_transformers(tokenizers, style, conversation):
    fast, tok, d = tokenizers[style]
    messages, tools = CONVERSATIONS[conversation], _tools(conversation)
    annotated = STYLES[style].annotated
    ref = fast.apply_chat_template(
        messages, tools=tools, chat_template=annotated, return_dict=True,
        return_assistant_tokens_mask=True,
    )  # fmt: skip
    template = ChatTemplate(
        annotated, special_tokens=ChatTemplate.from_pretrained(d).special_tokens
    )
    assert template.has_generation_tag
    enc = encode_chat(messages, tok, template, tools=tools)
    assert enc.ids.tolist() == ref["input_ids"]
    assert enc.loss_mask.tolist() == ref["assistant_masks"]


@pytest.mark.parametrize("style,conversation", cases())
@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_render_equals_transformers(tokenizers, style, conversation, add_generation_prompt):
    fast, _, d = tokenizers[style]
    messages, tools = CONVERSATIONS[conversation], _tools(conversation)
    if add_generation_prompt:
        messages = messages[:-1]
    ref = fast.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    template = ChatTemplate.from_pretrained(d)
    assert (
        template.render(messages, tools=tools, add_generation_prompt=add_generation_prompt) == ref
    )
    # The annotated variants are the same template: they render the same text.
    annotated = ChatTemplate(STYLES[style].annotated, special_tokens=template.special_tokens)
    assert (
        annotated.render(messages, tools=tools, add_generation_prompt=add_generation_prompt) == ref
    )


@pytest.mark.parametrize("style", ["chatml", "llama3"])
def test_continue_final_message_equals_transformers(tokenizers, style):
    fast, _, d = tokenizers[style]
    messages = CONVERSATIONS["multi_turn"][:-1] + [{"role": "assistant", "content": "Why did "}]
    ref = fast.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    got = ChatTemplate.from_pretrained(d).render(messages, continue_final_message=True)
    assert got == ref
    assert got.rstrip().endswith("Why did")  # the cut drops the turn's end token


def test_turn_ends_follow_each_assistant_turn(tokenizers):
    fast, tok, d = tokenizers["chatml"]
    messages = CONVERSATIONS["tool_calls"]
    enc = encode_chat(messages, tok, ChatTemplate.from_pretrained(d), tools=TOOLS)
    im_end = fast.convert_tokens_to_ids("<|im_end|>")
    # Each assistant turn ends at its <|im_end|>, and the mask is 1 there and 0 just after.
    assert enc.turn_ends.tolist() == sorted(enc.turn_ends.tolist())
    assert len(enc.turn_ends) == sum(m["role"] == "assistant" for m in messages)
    for end in enc.turn_ends:
        assert enc.ids[end - 1] == im_end and enc.loss_mask[end - 1] == 1
        assert end == len(enc.ids) or enc.loss_mask[end] == 0
    # Cutting at a turn end gives the render of the conversation up to that turn.
    k = 1  # after the first assistant turn (the tool call)
    cut = enc.ids[: enc.turn_ends[k]].tolist()
    upto = fast.apply_chat_template(messages[:5], tools=TOOLS, return_dict=False)
    assert cut == upto[: len(cut)] and fast.decode(upto[len(cut) :]).strip() == ""


def test_train_on_all_trains_every_token(tokenizers):
    _, tok, d = tokenizers["llama3"]
    messages = CONVERSATIONS["multi_turn"]
    template = ChatTemplate.from_pretrained(d)
    assistant = encode_chat(messages, tok, template)
    every = encode_chat(messages, tok, template, train_on="all")
    assert every.ids.tolist() == assistant.ids.tolist()
    assert every.loss_mask.tolist() == [1] * len(every.ids)
    assert every.turn_ends.tolist() == assistant.turn_ends.tolist()
    assert 0 < assistant.loss_mask.sum() < len(assistant.ids)


def test_globals_filters_and_whitespace_equal_transformers(tokenizers):
    # namespace, dict, loop controls, tojson's options and no HTML escaping, trim/lstrip_blocks,
    # strftime_now and the special-token variables all behave as in transformers.
    fast, _, d = tokenizers["llama3"]
    messages = [
        {"role": "user", "content": "<b>&'\"</b>"},
        {"role": "assistant", "content": "Ωμέγα", "extra": None},
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "y"},
        {"role": "assistant", "content": "z"},
    ]
    ref = fast.apply_chat_template(messages, tools=TOOLS, tokenize=False, chat_template=GLOBALS)
    got = ChatTemplate(GLOBALS, special_tokens=ChatTemplate.from_pretrained(d).special_tokens)
    assert got.render(messages, tools=TOOLS) == ref


def test_sandbox_blocks_what_transformers_blocks():
    bad = "{{ ''.__class__.__mro__ }}"
    with pytest.raises(Exception, match="unsafe|access"):
        ChatTemplate(bad).render([{"role": "user", "content": "x"}])
    with pytest.raises(Exception, match="underscore-prefixed"):
        ChatTemplate("{% set ns = namespace(_x=1) %}").render([])
