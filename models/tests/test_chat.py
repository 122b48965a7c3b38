"""Streaming generation (`TokenStream`), streamed text and checkpoint lookup of meltemi.models.chat.

The streamed tokens are compared with `generate` (one compiled while-loop, itself checked
against transformers in test_generate_hf.py); a compile counter shows that a new prompt or
budget in the same bucket runs the already compiled prefill and step.
"""

import jax
import model_testing as T
import pytest
from jax import monitoring

import meltemi.models as mm
from meltemi.models import chat, hf

PROMPTS = [[3, 17, 29, 4, 41], [5, 60], [7, 1, 33, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]]


@pytest.fixture(scope="module")
def model():
    return T.random_model(mm.get_preset("tiny-llama"), seed=3)


def test_greedy_stream_equals_generate_token_for_token(model):
    stream = chat.TokenStream(model)
    for p in PROMPTS:
        ref = mm.generate(model, [p], max_new_tokens=21, eos_token_id=None)[0]
        assert list(stream(p, max_new_tokens=21, eos_token_id=None)) == ref
        assert len(ref) == 21


def test_sampled_stream_equals_generate_with_the_same_key(model):
    sampling = mm.SamplingConfig(temperature=0.9, top_k=20, top_p=0.9)
    key = jax.random.key(11)
    ref = mm.generate(model, [PROMPTS[0]], max_new_tokens=12, sampling=sampling, key=key,
                      eos_token_id=None)[0]  # fmt: skip
    got = chat.generate_stream(
        model, PROMPTS[0], max_new_tokens=12, sampling=sampling, key=key, eos_token_id=None
    )
    assert list(got) == ref
    other = chat.generate_stream(
        model, PROMPTS[0], max_new_tokens=12, sampling=sampling, key=jax.random.key(12),
        eos_token_id=None,
    )  # fmt: skip
    assert list(other) != ref  # the key matters


def test_stream_stops_after_any_eos_id_of_the_list(model):
    free = mm.generate(model, [PROMPTS[1]], max_new_tokens=12, eos_token_id=None)[0]
    eos = [free[4], 66]  # the 5th token is an eos id: stop right after it
    got = list(chat.generate_stream(model, PROMPTS[1], max_new_tokens=12, eos_token_id=eos))
    assert got == free[: free.index(free[4]) + 1]
    assert got == mm.generate(model, [PROMPTS[1]], max_new_tokens=12, eos_token_id=eos)[0]


def test_tokens_arrive_before_generation_ends(model):
    """The stream is lazy: the first token is available before later ones are computed."""
    it = chat.generate_stream(model, PROMPTS[0], max_new_tokens=9, eos_token_id=None)
    first = next(it)
    ref = mm.generate(model, [PROMPTS[0]], max_new_tokens=9, eos_token_id=None)[0]
    assert first == ref[0] and list(it) == ref[1:]


def test_prefill_and_step_compile_once_per_bucket(model):
    compiles = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    stream = chat.TokenStream(model)
    list(stream([1, 2, 3], max_new_tokens=5, eos_token_id=None))  # warm: prompt 16, budget 16
    monitoring.register_event_duration_secs_listener(listener)
    try:
        # Other prompt lengths and budgets in the same buckets, and a longer run of steps.
        list(stream([4, 5, 6, 7, 8, 9, 10], max_new_tokens=16, eos_token_id=None))
        list(stream(list(range(1, 17)), max_new_tokens=11, eos_token_id=None))
        assert compiles == []
        list(stream(list(range(1, 18)), max_new_tokens=3, eos_token_id=None))  # prompt 32
        assert len(compiles) >= 1
    finally:
        monitoring.unregister_event_duration_listener(listener)


def test_stream_errors_are_raised_before_the_first_token(model):
    stream = chat.TokenStream(model)
    with pytest.raises(mm.ConfigError, match="max_seq_len=64; shorten the conversation"):
        stream(list(range(1, 60)), max_new_tokens=10)
    with pytest.raises(mm.ConfigError, match=r"temperature=0.5 needs key=\.\.\."):
        stream([1], max_new_tokens=3, sampling=mm.SamplingConfig(temperature=0.5))
    with pytest.raises(mm.ConfigError, match="max_new_tokens=0 must be >= 1"):
        stream([1], max_new_tokens=0)
    with pytest.raises(mm.ConfigError, match="cache_dtype='int8' is not one of"):
        chat.TokenStream(model, cache_dtype="int8")


class _Bytes:
    """A byte tokenizer: multi-byte characters arrive split over several tokens."""

    def decode(self, ids):
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def test_text_increments_never_split_a_character():
    text = "Καλη μέρα 🌊!"
    ids = list(text.encode()) + [257]  # and a special token, dropped
    pieces = list(chat.text_increments(_Bytes(), ids))
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert len(pieces) == len(text)  # one piece per character, as soon as it is complete


def test_find_checkpoint_takes_a_runs_newest_export(tmp_path):
    cfg = mm.get_preset("tiny-llama")
    model = T.random_model(cfg, seed=1)
    for step in (9, 120, 40):
        hf.save(model, cfg, tmp_path / "run" / "hf" / f"step_{step:08d}")
    (tmp_path / "run" / "hf" / "step_00000500").mkdir()  # an export still being written
    assert chat.find_checkpoint(tmp_path / "run") == tmp_path / "run/hf/step_00000120"
    direct = tmp_path / "run/hf/step_00000009"
    assert chat.find_checkpoint(direct) == direct


def test_find_checkpoint_names_the_export_flag_for_a_run_without_exports(tmp_path):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "config.json").write_text("{}")
    with pytest.raises(chat.ChatError, match=r"--config\.checkpoint\.export_hf=True"):
        chat.find_checkpoint(tmp_path / "run")
    with pytest.raises(chat.ChatError, match="no such directory"):
        chat.find_checkpoint(tmp_path / "missing")


def test_an_export_keeps_a_template_stored_in_chat_template_jinja(model, tmp_path):
    src = tmp_path / "tok"
    src.mkdir()
    (src / "tokenizer_config.json").write_text("{}")
    (src / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    written = hf.save(model, model.config, tmp_path / "out", tokenizer=src)
    assert "chat_template.jinja" in written
    assert (tmp_path / "out" / "chat_template.jinja").read_text().startswith("{% for m")
