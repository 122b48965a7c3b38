"""Short real runs of the `chat` binary on a tiny chat checkpoint: one `--prompt` answer, tokens
written as they are generated, the interactive mode's history, and the one-line errors."""

import io
import sys

import chat as chat_bin
import chat_testing as C
import pytest

from meltemi.models import chat

ARGS = ["--max_new_tokens=12"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return C.write_checkpoint(tmp_path_factory.mktemp("chat") / "ckpt", seed=8)


@pytest.fixture(scope="module")
def reference(ckpt):
    return chat.Chat.from_directory(ckpt)


def test_prompt_prints_the_greedy_answer_and_exits(ckpt, reference, capsys):
    code = chat_bin.main(
        [f"--checkpoint={ckpt}", "--prompt=Καλημέρα!", "--system=Be brief.", *ARGS]
    )
    assert code == 0
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Καλημέρα!"},
    ]
    expected = reference.reply(messages, max_new_tokens=12)
    assert expected.strip()
    assert capsys.readouterr().out == expected + "\n"


class _Recorder(io.StringIO):
    """stdout that notes how many tokens had been generated at each write."""

    def __init__(self, counter):
        super().__init__()
        self.counter, self.writes = counter, []

    def write(self, s):
        self.writes.append((self.counter[0], s))
        return super().write(s)


def test_tokens_are_written_as_they_are_generated(ckpt, monkeypatch):
    produced = [0]
    original = chat.Chat.stream

    def counting(self, messages, **kwargs):
        for tok in original(self, messages, **kwargs):
            produced[0] += 1
            yield tok

    monkeypatch.setattr(chat.Chat, "stream", counting)
    out = _Recorder(produced)
    monkeypatch.setattr(sys, "stdout", out)
    assert chat_bin.main([f"--checkpoint={ckpt}", "--prompt=Hello!", *ARGS]) == 0
    counts = [n for n, s in out.writes if s]
    assert len(counts) >= 3 and counts == sorted(counts)
    # The first text is out after the first token, long before the last one.
    assert counts[0] <= 2 < produced[0]


def test_interactive_mode_keeps_the_conversation(ckpt, reference, monkeypatch, capsys):
    system = {"role": "system", "content": "Be kind."}
    first = reference.reply([system, {"role": "user", "content": "Hello!"}], max_new_tokens=12)
    seen = []
    original = chat.Chat.stream

    def recording(self, messages, **kwargs):
        seen.append([dict(m) for m in messages])
        return original(self, messages, **kwargs)

    monkeypatch.setattr(chat.Chat, "stream", recording)
    stdin = io.StringIO("Hello!\nWhat is the capital of Greece?\n/reset\nτι κάνεις;\n")
    assert chat_bin.main([f"--checkpoint={ckpt}", "--system=Be kind.", *ARGS], stdin=stdin) == 0
    assert seen[1] == [
        system,
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": first},
        {"role": "user", "content": "What is the capital of Greece?"},
    ]
    assert seen[2] == [system, {"role": "user", "content": "τι κάνεις;"}]  # after /reset
    assert len(seen) == 3
    assert first + "\n" in capsys.readouterr().out


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("error: ")
    return err[0]


def test_a_checkpoint_without_a_chat_template_names_the_flag(tmp_path, capsys):
    ckpt = C.write_checkpoint(tmp_path / "plain", template=None)
    assert chat_bin.main([f"--checkpoint={ckpt}", "--prompt=Hi"]) == 2
    assert "pass --chat_template=FILE" in _error(capsys)
    template = tmp_path / "chatml.jinja"
    template.write_text(C.CHATML)
    argv = [f"--checkpoint={ckpt}", "--prompt=Hi", f"--chat_template={template}", *ARGS]
    assert chat_bin.main(argv) == 0
    assert capsys.readouterr().out.endswith("\n")


def test_a_template_that_refuses_the_conversation_is_one_error_line(ckpt, tmp_path, capsys):
    template = tmp_path / "no_system.jinja"  # as Gemma's: no system turn
    template.write_text(
        "{%- if messages[0]['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{%- endif %}" + C.CHATML
    )
    argv = [f"--checkpoint={ckpt}", "--prompt=Hi", f"--chat_template={template}", *ARGS]
    assert chat_bin.main([*argv, "--system=Be brief."]) == 2
    assert "refused this conversation: System role not supported" in _error(capsys)
    assert chat_bin.main(argv) == 0


def test_a_run_directory_without_exports_names_the_export_key(tmp_path, capsys):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    assert chat_bin.main([f"--checkpoint={tmp_path / 'run'}", "--prompt=Hi"]) == 2
    assert "--config.checkpoint.export_hf=True" in _error(capsys)


def test_a_run_directory_chats_with_its_newest_export(ckpt, tmp_path, capsys):
    run = tmp_path / "run"
    (run / "hf").mkdir(parents=True)
    (run / "hf" / "step_00000010").symlink_to(ckpt)
    assert chat_bin.main([f"--checkpoint={run}", "--prompt=Hello!", *ARGS]) == 0
    assert capsys.readouterr().out.strip()


def test_a_conversation_too_long_for_the_model_is_one_error_line(ckpt, capsys):
    argv = [f"--checkpoint={ckpt}", "--prompt=" + "Hello! " * 200, *ARGS]
    assert chat_bin.main(argv) == 2
    assert "exceeds the model's max_seq_len=256" in _error(capsys)
