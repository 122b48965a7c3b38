"""meltemi.data.chat: conversations rendered with a tokenizer's chat template, with loss masks.

Preference pairs (a prompt, a chosen and a rejected reply) for DPO-style training are
`PreferenceFiles` / `encode_preference`: the loss mask covers only the replies.

Templates render exactly as `transformers`' `apply_chat_template` renders them (the same Jinja
sandbox, globals and filters; `transformers` is not imported), and the loss mask is the one
`return_assistant_tokens_mask=True` gives: `{% generation %}` blocks where the template has
them, the rendered span of each assistant message where it does not. Needs Jinja2
(`pip install 'meltemi-data[chat]'`).

>>> from meltemi.data import ByteTokenizer
>>> t = ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content }}{{ eos_token }}"
...                  "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
>>> enc = encode_chat([{"role": "user", "content": "hi"},
...                    {"role": "assistant", "content": "yo"}], ByteTokenizer(), t)
>>> ByteTokenizer().decode(enc.ids[enc.loss_mask == 1]), enc.ids[-1], enc.turn_ends.tolist()
('yo', np.int32(257), [23])
"""

from meltemi.data.chat._encode import (
    ROLES,
    TRAIN_ON,
    ChatRowError,
    EncodedChat,
    check_messages,
    encode_chat,
)
from meltemi.data.chat._files import ChatFiles
from meltemi.data.chat._preference import (
    PREFERENCE_REASONS,
    EncodedPair,
    PreferenceFiles,
    encode_preference,
)
from meltemi.data.chat._template import (
    CONFIG_KEY,
    SPECIAL_TOKEN_KEYS,
    ChatTemplate,
    ChatTemplateError,
)

__all__ = [
    "CONFIG_KEY",
    "PREFERENCE_REASONS",
    "ROLES",
    "SPECIAL_TOKEN_KEYS",
    "TRAIN_ON",
    "ChatFiles",
    "ChatRowError",
    "ChatTemplate",
    "ChatTemplateError",
    "EncodedChat",
    "EncodedPair",
    "PreferenceFiles",
    "check_messages",
    "encode_chat",
    "encode_preference",
]
