"""Hugging Face side of the parity tests: tiny random transformers models built locally.

Nothing here touches the network: models are built from configs (never from the hub), on the
CPU, in float32. The configs are the literal ones of `hf_configs.py`, never derived from our
own `to_hf_config`, so the HF side of every parity test is independent of our export.
"""

from __future__ import annotations

import pathlib

import numpy as np
import torch
import transformers
from hf_configs import reference_config

transformers.logging.set_verbosity_error()
torch.manual_seed(0)


def hf_param_count(preset: str) -> int:
    """Parameters of the HF model of `preset`, built on the meta device (no memory)."""
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(reference_config(preset))
    return sum(p.numel() for p in model.parameters())


def random_hf_model(preset: str, seed: int = 0) -> torch.nn.Module:
    """A randomly initialised HF model; norm weights are randomised too so that a missed
    (1 + w) convention or an unloaded norm cannot hide behind weights of one."""
    torch.manual_seed(seed)
    # The eager expert loop: torch's grouped_mm on CPU needs 16-byte-aligned (not odd) sizes.
    model = transformers.AutoModelForCausalLM.from_config(
        reference_config(preset), experts_implementation="eager"
    )
    model = model.float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))
    return model


def save_hf(model: torch.nn.Module, directory: pathlib.Path, **kwargs) -> pathlib.Path:
    model.save_pretrained(directory, **kwargs)
    return directory


def load_hf(directory: pathlib.Path) -> torch.nn.Module:
    return transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, experts_implementation="eager"
    ).eval()


def hf_logits(model: torch.nn.Module, tokens: np.ndarray, mask: np.ndarray | None = None):
    with torch.no_grad():
        kwargs = {}
        if mask is not None:
            kwargs["attention_mask"] = torch.tensor(mask, dtype=torch.long)
        out = model(torch.tensor(np.asarray(tokens), dtype=torch.long), **kwargs)
    return out.logits.float().numpy()


def hf_generate(
    model: torch.nn.Module,
    prompts: list[list[int]],
    max_new_tokens: int,
    eos: list[int] | None = None,
) -> list[list[int]]:
    """`transformers`' greedy `generate` (with its KV cache) over left-padded prompts, as
    `meltemi.models.generate` pads them; with `eos`, each row is cut after its first eos id."""
    width = max(len(p) for p in prompts)
    ids = np.zeros((len(prompts), width), np.int64)
    mask = np.zeros_like(ids)
    for b, p in enumerate(prompts):
        ids[b, width - len(p) :] = p
        mask[b, width - len(p) :] = 1
    with torch.no_grad():
        out = model.generate(
            torch.tensor(ids),
            attention_mask=torch.tensor(mask),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=0,
        )[:, width:].tolist()
    if not eos:
        return out
    return [
        row[: next((i + 1 for i, tok in enumerate(row) if tok in eos), len(row))] for row in out
    ]
