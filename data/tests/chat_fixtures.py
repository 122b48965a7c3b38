# ruff: noqa: E501 (the templates are verbatim copies)
"""Real chat templates (copied as literals), `{% generation %}`-annotated variants that render
the same text, tiny HF tokenizers trained here, and conversations for the chat tests."""

from __future__ import annotations

import dataclasses
import pathlib

# Qwen2.5-Instruct (ChatML with tools).
QWEN25 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

# The same, with the assistant's text and <|im_end|> in {% generation %} (as TRL annotates it).
QWEN25_GEN = (
    QWEN25.replace(
        r"""    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}""",
        r"""    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>assistant\n' }}
        {%- generation %}
        {%- if message.content %}
            {{- message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if message.content or not loop.first %}
                {{- '\n' }}
            {%- endif %}""",
    )
    .replace(
        r"""            {{- '\n<tool_call>\n{"name": "' }}""",
        r"""            {{- '<tool_call>\n{"name": "' }}""",
    )
    .replace(
        r"""            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}""",
        r"""            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\n' }}""",
    )
)

# Meta-Llama-3-8B-Instruct.
LLAMA3 = r"""{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>

'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>

' }}{% endif %}"""

LLAMA3_GEN = r"""{% set loop_messages = messages %}{% for message in loop_messages %}{% if loop.index0 == 0 %}{{ bos_token }}{% endif %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>

' }}{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}{% else %}{{ message['content'] | trim + '<|eot_id|>' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>

' }}{% endif %}"""

# allenai Tulu 3 / OLMo 2 Instruct.
TULU = r"""{% for message in messages %}{% if message['role'] == 'system' %}{{ '<|system|>
' + message['content'] + '
' }}{% elif message['role'] == 'user' %}{{ '<|user|>
' + message['content'] + '
' }}{% elif message['role'] == 'assistant' %}{% if not loop.last %}{{ '<|assistant|>
'  + message['content'] + eos_token + '
' }}{% else %}{{ '<|assistant|>
'  + message['content'] + eos_token }}{% endif %}{% endif %}{% if loop.last and add_generation_prompt %}{{ '<|assistant|>
' }}{% endif %}{% endfor %}"""

TULU_GEN = r"""{% for message in messages %}{% if message['role'] == 'system' %}{{ '<|system|>
' + message['content'] + '
' }}{% elif message['role'] == 'user' %}{{ '<|user|>
' + message['content'] + '
' }}{% elif message['role'] == 'assistant' %}{{ '<|assistant|>
' }}{% generation %}{{ message['content'] + eos_token }}{% endgeneration %}{% if not loop.last %}{{ '
' }}{% endif %}{% endif %}{% if loop.last and add_generation_prompt %}{{ '<|assistant|>
' }}{% endif %}{% endfor %}"""

# google/gemma-2-2b-it (no system role; roles must alternate).
GEMMA = r"""{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '
' + message['content'] | trim + '<end_of_turn>
' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model
'}}{% endif %}"""

GEMMA_GEN = r"""{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '
' }}{% if role == 'model' %}{% generation %}{{ message['content'] | trim + '<end_of_turn>' }}{% endgeneration %}{% else %}{{ message['content'] | trim + '<end_of_turn>' }}{% endif %}{{ '
' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model
'}}{% endif %}"""


# transformers' globals, filters and whitespace control in one template.
GLOBALS = r"""{%- set ns = namespace(n=0) -%}
{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.n = ns.n + 1 -%}{%- continue -%}{%- endif -%}
{{ m | tojson(indent=2, sort_keys=True) }}{{ dict(a=1) | tojson }}{% if loop.index > 3 %}{% break %}{% endif %}
  {% if True %}   x{% endif %}
{% endfor %}{{ ns.n }}|{{ strftime_now('%Y') }}|{{ bos_token }}|{{ eos_token }}|{{ tools | tojson }}"""


@dataclasses.dataclass(frozen=True)
class Style:
    """A template family: its plain and annotated templates and its tokenizer's specials."""

    name: str
    template: str
    annotated: str
    specials: tuple[str, ...]
    bos: str | None
    eos: str
    trim_offsets: bool  # the ByteLevel post-processor's (Qwen/Llama: False; GPT-2: True)
    system: bool = True  # the template accepts a system turn
    tools: bool = False  # the template renders tool calls


STYLES = {
    "chatml": Style("chatml", QWEN25, QWEN25_GEN, ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
                    None, "<|im_end|>", False, tools=True),
    "llama3": Style("llama3", LLAMA3, LLAMA3_GEN,
                    ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                     "<|end_header_id|>", "<|eot_id|>"), "<|begin_of_text|>", "<|eot_id|>", False),
    "tulu": Style("tulu", TULU, TULU_GEN, ("<|endoftext|>", "<|pad|>"), None, "<|endoftext|>",
                  True),
    "gemma": Style("gemma", GEMMA, GEMMA_GEN,
                   ("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"), "<bos>",
                   "<eos>", True, system=False),
}  # fmt: skip

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Τρέχων καιρός σε μια πόλη",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "the city"}},
                "required": ["city"],
            },
        },
    }
]

CONVERSATIONS = {
    "multi_turn": [
        {"role": "user", "content": "Καλημέρα! Πώς είσαι;"},
        {"role": "assistant", "content": "Very well, thank you. 日本語も話せます 🙂"},
        {"role": "user", "content": "  Tell me a joke.\n"},
        {"role": "assistant", "content": "Why did the chicken cross the road?\nTo get to the other side."},
    ],
    "system_prompt": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
    ],
    "empty_assistant": [
        {"role": "user", "content": "Say nothing."},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "Now say ok."},
        {"role": "assistant", "content": "ok"},
    ],
    "tool_calls": [
        {"role": "system", "content": "You can look up the weather."},
        {"role": "user", "content": "Τι καιρό κάνει στην Αθήνα;"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Αθήνα"}}}]},
        {"role": "tool", "content": "{\"temp_c\": 31, \"sky\": \"clear\"}"},
        {"role": "assistant", "content": "Let me check twice.", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Athens"}}},
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Αθήνα"}}}]},
        {"role": "tool", "content": "31"},
        {"role": "tool", "content": "31"},
        {"role": "assistant", "content": "Είναι 31°C και αίθριος."},
    ],
}  # fmt: skip

CORPUS = [
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    "system user assistant model tool_call tool_response arguments name get_weather city",
    *[m.get("content") or "" for c in CONVERSATIONS.values() for m in c],
] * 5


def cases():
    """(style, conversation) pairs each template accepts."""
    out = []
    for s in STYLES.values():
        for c in CONVERSATIONS:
            if (c == "tool_calls" and not s.tools) or (c == "system_prompt" and not s.system):
                continue
            out.append((s.name, c))
    return out


def hf_tokenizer(directory: pathlib.Path, style: Style, template: str | None = None):
    """A byte-level BPE trained here, saved as an HF tokenizer directory (with `template` as
    its chat_template), and loaded by `transformers`. Returns the `PreTrainedTokenizerFast`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=style.trim_offsets)
    trainer = trainers.BpeTrainer(
        vocab_size=420,
        special_tokens=list(style.specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=style.bos,
        eos_token=style.eos,
        chat_template=template,
    )
    fast.save_pretrained(str(directory))
    return fast
