"""lm-evaluation-harness: our `meltemi` model against lm-eval's own `hf` model, offline.

One tiny random Llama and a character-level tokenizer are built here and saved as a Hugging
Face directory (nothing is downloaded); both models read that same directory, so any
difference is in the adapter: tokenization, truncation, batching or scoring.
"""

import os

# Before lm-eval, datasets and huggingface_hub are imported (they read these at import).
for _key in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_key, "1")

import pathlib  # noqa: E402
import string  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import _subprocess  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tokenizers  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402

from meltemi.levanter.evaluation import EvalError  # noqa: E402
from meltemi.levanter.harness import MeltemiLM, harness_metrics, run_tasks  # noqa: E402

TASK = "meltemi_tiny_mc"
HARNESS = _subprocess.TRAIN.parent / "harness.py"


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    chars = sorted(set(string.printable))
    vocab = {"<unk>": 0, "<bos>": 1, "<eos>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    vocab.update({f"<filler{i}>": i for i in range(len(vocab), 128)})
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex("."), behavior="isolated")
    tok.decoder = tokenizers.decoders.Fuse()
    tok.add_special_tokens(["<unk>", "<bos>", "<eos>"])
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )
    fast.save_pretrained(root)
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(
                (1.0 + 0.2 * torch.randn_like(p)) if "norm" in name else 0.3 * torch.randn_like(p)
            )
    model.save_pretrained(root)
    return root


@pytest.fixture(scope="module")
def ours(hf_dir):
    return MeltemiLM(checkpoint=str(hf_dir), batch_size=8)


@pytest.fixture(scope="module")
def theirs(hf_dir):
    return HFLM(pretrained=str(hf_dir), dtype="float32", device="cpu", batch_size=8)


def _by_doc(results):
    return {s["doc_id"]: s for s in results["samples"][TASK]}


def test_task_log_likelihoods_and_accuracy_match_lm_evals_hf_model(ours, theirs):
    a = run_tasks(ours, [TASK], log_samples=True)
    b = run_tasks(theirs, [TASK], log_samples=True)
    docs_a, docs_b = _by_doc(a), _by_doc(b)
    assert sorted(docs_a) == sorted(docs_b) == list(range(20))
    for doc, sample in docs_a.items():
        ll_a = [float(r[0][0]) for r in sample["resps"]]
        ll_b = [float(r[0][0]) for r in docs_b[doc]["resps"]]
        np.testing.assert_allclose(ll_a, ll_b, atol=1e-4, rtol=0)
        assert [r[0][1] for r in sample["resps"]] == [r[0][1] for r in docs_b[doc]["resps"]]
        assert sample["acc"] == docs_b[doc]["acc"]
    metrics = harness_metrics(a)
    assert metrics[f"harness/{TASK}/acc"] == harness_metrics(b)[f"harness/{TASK}/acc"]
    assert set(metrics) == {f"harness/{TASK}/acc", f"harness/{TASK}/acc_norm"}


def _requests(kind, args):
    return [Instance(kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


def test_rolling_log_likelihood_over_several_windows_matches(hf_dir, theirs):
    # max_length 24: a 70-character text takes three windows.
    short = MeltemiLM(checkpoint=str(hf_dir), batch_size=2, max_length=24)
    theirs._max_length = 24
    try:
        texts = [("The quick brown fox jumps over the lazy dog, again and again and again.",),
                 ("Short one.",)]  # fmt: skip
        a = short.loglikelihood_rolling(_requests("loglikelihood_rolling", texts))
        b = theirs.loglikelihood_rolling(_requests("loglikelihood_rolling", texts))
    finally:
        theirs._max_length = None
    np.testing.assert_allclose(a, b, atol=1e-4, rtol=0)


def test_greedy_generate_until_matches(ours, theirs):
    args = [("Question: Two plus two equals", {"until": ["\n"], "max_gen_toks": 6}),
            ("Snow is", {"until": ["."], "max_gen_toks": 9, "do_sample": False})]  # fmt: skip
    a = ours.generate_until(_requests("generate_until", args))
    b = theirs.generate_until(_requests("generate_until", args))
    assert a == b and all(isinstance(t, str) for t in a)


def test_errors_name_the_fix(tmp_path, ours):
    with pytest.raises(EvalError, match=r"needs a checkpoint: --model_args checkpoint=DIR"):
        MeltemiLM()
    with pytest.raises(EvalError, match=r"--checkpoint=.*no such directory"):
        MeltemiLM(checkpoint=str(tmp_path / "missing"))
    with pytest.raises(EvalError, match=r"unknown to lm-eval.*Did you mean meltemi_tiny_mc"):
        run_tasks(ours, ["meltemi_tiny_mcc"])


def test_the_task_index_is_built_once_per_process(ours, monkeypatch):
    # Indexing lm-eval's built-in task files takes 12-30 s; a training run asks at every
    # harness step, so every call after the first reuses the index. (The cache is not cleared
    # here: the other tests' full index stays built. An earlier test may have built ours.)
    import lm_eval.tasks

    from meltemi.levanter.harness import _run

    built = []

    class Counting(lm_eval.tasks.TaskManager):
        def __init__(self, *args, **kwargs):
            built.append(kwargs.get("include_defaults"))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", Counting)
    first = run_tasks(ours, [TASK], limit=2)
    second = run_tasks(ours, [TASK], limit=2)
    assert _run.task_manager((), [TASK]) is _run.task_manager((), [TASK])
    assert built in ([], [False])  # at most once, and our tasks only: no built-ins indexed
    assert harness_metrics(first) == harness_metrics(second)


def test_the_binary_prints_the_table_and_writes_harness_json(hf_dir, tmp_path):
    out = tmp_path / "harness.json"
    env = _subprocess.env()
    cmd = [sys.executable, str(HARNESS), f"--checkpoint={hf_dir}", f"--tasks={TASK}",
           "--limit=4", f"--output={out}"]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert TASK in proc.stdout and "acc" in proc.stdout
    import json

    data = json.loads(out.read_text())
    assert 0.0 <= data["metrics"][f"harness/{TASK}/acc"] <= 1.0
    bad = subprocess.run(
        [sys.executable, str(HARNESS), f"--checkpoint={tmp_path / 'nope'}", f"--tasks={TASK}"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1].startswith("error: --checkpoint=")
    assert os.path.exists(out)


# -- `lm_eval --model meltemi`: the opt-in meltemi-lm-eval wheel's .pth hook -------------------

LEVANTER = pathlib.Path(__file__).absolute().parents[1]
LM_EVAL_HOOK = LEVANTER.parent / "lm-eval"  # the meltemi-lm-eval wheel's folder
# Adds the site directories of argv[1] (os.pathsep-separated; their .pth files run), then runs
# lm-eval's own command line, or `python -m meltemi.levanter.harness` when argv[2] is "-m".
_CLI = (
    "import runpy, site, sys; [site.addsitedir(d) for d in sys.argv.pop(1).split(':') if d]; "
    "module = 'meltemi.levanter.harness' if sys.argv[1] == '-m' else 'lm_eval'; "
    "sys.argv.pop(1); sys.argv[0] = module; "
    "runpy.run_module(module, run_name='__main__', alter_sys=True)"
)
_PROBE = (
    "import site, sys; [site.addsitedir(d) for d in sys.argv[1].split(':') if d]; "
    "print(sorted({m.split('.')[0] for m in sys.modules} & {'jax', 'lm_eval', 'meltemi'})); "
    "import lm_eval.models; from lm_eval.api.registry import model_registry; "
    "print(dict(model_registry.items()).get('meltemi'))"
)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The meltemi-levanter wheel and the meltemi-lm-eval wheel, built from their folders and
    pip-installed (`--target`, no deps) into two fresh site directories; the subprocess
    environment lacks `levanter/src`, so `meltemi.levanter` (and any hook) come from wheels."""
    from tools.wheels import wheel_lib

    tmp = tmp_path_factory.mktemp("wheel")
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
    sites = {}
    for name, folder in [("levanter", LEVANTER), ("hook", LM_EVAL_HOOK)]:
        src = wheel_lib.copy_library(folder, tmp / "src" / name)
        wheel = wheel_lib.build(src, tmp / "dist", sdist=False)
        sites[name] = tmp / f"site-{name}"
        subprocess.run([*pip, "--target", str(sites[name]), str(wheel)], check=True, timeout=300)
    env = _subprocess.env()
    keep = [p for p in sys.path if p and not (pathlib.Path(p) / "meltemi" / "levanter").is_dir()]
    env["PYTHONPATH"] = os.pathsep.join(keep)
    return sites["levanter"], sites["hook"], env


def _probe(env, *site_dirs):
    return subprocess.run(
        [sys.executable, "-c", _PROBE, ":".join(map(str, site_dirs))],
        env=env, capture_output=True, text=True, timeout=300,
    ).stdout.splitlines()  # fmt: skip


def test_the_levanter_wheel_alone_installs_no_pth_and_leaves_lm_eval_without_meltemi(installed):
    levanter_site, _, env = installed
    assert (levanter_site / "meltemi" / "levanter" / "harness" / "__init__.py").is_file()
    assert sorted(p.name for p in levanter_site.glob("*.pth")) == []
    assert _probe(env, levanter_site) == ["[]", "None"]


def test_the_hook_wheel_registers_meltemi_only_when_lm_eval_loads_its_models(installed):
    levanter_site, hook_site, env = installed
    assert sorted(p.name for p in hook_site.glob("*.pth")) == ["meltemi_lm_eval.pth"]
    # Start-up imports nothing of lm-eval, JAX or Meltemi; `lm_eval.models` gets the lazy entry.
    target = "meltemi.levanter.harness._model:MeltemiLM"
    assert _probe(env, levanter_site, hook_site) == ["[]", target]


@pytest.mark.parametrize("command", ["lm_eval", "-m"], ids=["lm_eval+hook", "python-m-no-hook"])
def test_lm_evals_own_cli_runs_the_meltemi_model(installed, hf_dir, ours, tmp_path, command):
    """`lm_eval --model meltemi` with the hook wheel; `python -m meltemi.levanter.harness`
    (the same command line) with the levanter wheel alone."""
    levanter_site, hook_site, env = installed
    sites = [levanter_site, hook_site] if command == "lm_eval" else [levanter_site]
    tasks_dir = LEVANTER / "harness_tasks"
    cmd = [sys.executable, "-c", _CLI, ":".join(map(str, sites)), command, "--model", "meltemi",
           "--model_args", f"checkpoint={hf_dir}", "--tasks", TASK, "--include_path",
           str(tasks_dir), "--limit", "4", "--output_path", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "meltemi ({'checkpoint': " in proc.stdout and TASK in proc.stdout
    import json

    (path,) = tmp_path.glob("**/results_*.json")
    results = json.loads(path.read_text())
    assert results["config"]["model"] == "meltemi"
    assert harness_metrics(results) == harness_metrics(run_tasks(ours, [TASK], limit=4))


# -- the harness during training ---------------------------------------------------------------


def _resolved(root, *extra):
    from meltemi.levanter.config import load_config

    return load_config(
        f"{_subprocess.DEFAULT}:smoke",
        [("run_dir", str(root / "run")), ("data.cache_dir", str(root / "cache")),
         ("eval.num_batches", "0"), *extra],
    )  # fmt: skip


def test_harness_keys_are_checked(tmp_path):
    from meltemi.levanter.config import ConfigError, InertKeyError, resolve

    with pytest.raises(ConfigError, match=r"eval.harness_tasks=.* needs eval.harness_every_steps"):
        resolve(_resolved(tmp_path, ("eval.harness_tasks", "('meltemi_tiny_mc',)")))
    with pytest.raises(InertKeyError, match=r"eval.harness_every_steps=5 has no effect without"):
        resolve(_resolved(tmp_path, ("eval.harness_every_steps", "5")))
    with pytest.raises(InertKeyError, match=r"eval.harness_limit=3 has no effect without"):
        resolve(_resolved(tmp_path, ("eval.harness_limit", "3")))
    with pytest.raises(ConfigError, match=r"eval.harness_tasks=.*a task is named twice"):
        resolve(_resolved(tmp_path, ("eval.harness_tasks", "('a','a')"),
                          ("eval.harness_every_steps", "1")))  # fmt: skip
    with pytest.raises(ConfigError, match=r"harness_include_path: .* is not a directory"):
        resolve(_resolved(tmp_path, ("eval.harness_tasks", "('a',)"),
                          ("eval.harness_every_steps", "1"),
                          ("eval.harness_include_path", f"('{tmp_path / 'nope'}',)")))  # fmt: skip
    spec = resolve(_resolved(tmp_path, ("eval.harness_tasks", "('meltemi_tiny_mc',)"),
                             ("eval.harness_every_steps", "2")))  # fmt: skip
    assert spec.eval.harness_tasks == ("meltemi_tiny_mc",) and spec.eval.harness_every_steps == 2


def test_the_trainer_runs_the_harness_and_logs_it(tmp_path, caplog):
    import json

    import jax

    from meltemi.levanter.config import resolve
    from meltemi.levanter.main._hooks import training_hooks
    from meltemi.levanter.mesh import make_mesh
    from meltemi.levanter.trainer import Trainer

    mesh = make_mesh({"data": 1}, devices=jax.devices()[:1])
    bad = resolve(_resolved(tmp_path, ("eval.harness_tasks", "('meltemi_tiny_mcq',)"),
                            ("eval.harness_every_steps", "1")))  # fmt: skip
    with pytest.raises(EvalError, match=r"'meltemi_tiny_mcq' is unknown to lm-eval"):
        training_hooks(bad)  # what the binary adds to the trainer, checked before any step
    spec = resolve(
        _resolved(
            tmp_path,
            ("eval.harness_tasks", "('meltemi_tiny_mc',)"),
            ("eval.harness_every_steps", "1"),
            ("eval.harness_limit", "4"),
        )
    )
    # The binary's wiring (main/): the trainer runs the harness only as a hook given to it,
    # and says so when the config asks for tasks but no hook is given.
    with caplog.at_level("WARNING"):
        Trainer(spec, mesh=mesh)
    assert "eval.harness_tasks=('meltemi_tiny_mc',): the trainer runs them only as a hook" in (
        caplog.text
    )
    (hook,) = training_hooks(spec)
    Trainer(spec, mesh=mesh, hooks=[hook]).run()
    records = [
        json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().split("\n") if x
    ]
    key = f"harness/{TASK}/acc"
    assert [r["step"] for r in records if key in r] == [1, 2]
    # The logged numbers are the final parameters' (what the checkpoint holds).
    lm = MeltemiLM(checkpoint=str(tmp_path / "run"))
    again = harness_metrics(run_tasks(lm, [TASK], limit=4))
    assert again[key] == records[-1][key]
    assert again[f"harness/{TASK}/acc_norm"] == records[-1][f"harness/{TASK}/acc_norm"]
