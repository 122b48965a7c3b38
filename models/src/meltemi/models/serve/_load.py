"""Loading a checkpoint for serving: model, tokenizer, chat template, engine, runner, app."""

from __future__ import annotations

import os
import pathlib
from typing import Any

from meltemi.models import chat, hf
from meltemi.models.engine import Engine, EngineConfig
from meltemi.models.serve._app import create_app
from meltemi.models.serve._runner import EngineRunner


def load_app(
    checkpoint: str | os.PathLike,
    config: EngineConfig,
    *,
    model_name: str | None = None,
    chat_template: str | os.PathLike | None = None,
    api_key: str | None = None,
    warmup: bool = True,
) -> tuple[Any, EngineRunner]:
    """Loads `checkpoint` and returns `(app, runner)` with the runner's thread started.

    Args:
        checkpoint: a Hugging Face directory, or a run directory (its newest `hf/step_*`).
        config: the engine's memory plan.
        model_name: the served name (default: the checkpoint directory's name).
        chat_template: a Jinja file replacing the checkpoint's chat template.
        api_key: the Bearer token every route but `/health` needs (`None`: no check).
        warmup: compile the engine's programs before returning.

    Raises:
        meltemi.models.chat.ChatError: no checkpoint or no tokenizer.json there.
        meltemi.models.engine.EngineError: `config` does not fit the model.
    """
    from meltemi.data.chat import ChatTemplate, ChatTemplateError

    directory = chat.find_checkpoint(checkpoint)
    tokenizer = chat.load_tokenizer(directory)
    try:
        template = ChatTemplate.from_pretrained(directory, template_file=chat_template)
    except ChatTemplateError:
        if chat_template is not None:
            raise
        template = None  # /v1/chat/completions then says how to give one
    model, _ = hf.load(directory)
    runner = EngineRunner(Engine(model, config))
    runner.start(warmup=warmup)
    name = model_name or pathlib.Path(directory).resolve().name
    app = create_app(runner, tokenizer, model_name=name, template=template, api_key=api_key)
    return app, runner
