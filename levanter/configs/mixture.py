"""A data mixture: the standard library's modules and its test suite, reweighted mid-run.

    ./bazelw run //levanter:train -- --config=levanter/configs/mixture.py
    ./bazelw run //levanter:train -- --config=levanter/configs/mixture.py:smoke

default.py's model, optimizer and schedule (400 steps of 16 x 128 bytes), trained on two
components: `stdlib` (the library's modules, as in default.py) and `tests` (the interpreter's
own test suite, `test/test_[a-w]*.py`; `test_[x-z]*.py` are held out for evaluation). Three
quarters library code and one quarter tests until step 200, then half and half.
`metrics.jsonl` logs `data/stdlib/fraction` and `data/tests/fraction` every step, and each
component is evaluated on its own held-out text (`eval/stdlib/...`, `eval/tests/...`).
Change a weight from the command line:

    --config.data.components.tests.weight=0.5 --config.data.components.stdlib.weight=0.5
    --config.data.weight_stages="((100, {'stdlib': 0.2, 'tests': 0.8}),)"

Needs the interpreter's test suite (`<stdlib>/test`); some Linux distributions package it
separately (Debian: libpython3.X-testsuite).
"""

import os
import sysconfig

from meltemi.levanter.config import mixture_component, sibling_config, smoke_variant, with_variant

TESTS = os.path.join(sysconfig.get_paths()["stdlib"], "test")


VARIANTS = {
    # default.py's two-step tiny model; the batch size and the weights change at step 1.
    "smoke": smoke_variant(
        "mixture-smoke",
        {
            "eval.every_steps": 0,
            "data.seq_len": 32,
            "trainer.batch_schedule": "0:4,1:8",
            "data.weight_stages": ((1, {"stdlib": 0.5, "tests": 0.5}),),
        },
    ),
}


def get_config(variant=None):
    config = sibling_config(__file__, "default.py")
    config.unlock()
    config.name = "mixture"
    config.data.source = "mixture"
    config.data.components.stdlib = mixture_component(
        "stdlib:train", 0.75, validation="stdlib:validation"
    )
    config.data.components.tests = mixture_component(
        f"text:{TESTS}/test_[a-w]*.py", 0.25, validation=f"text:{TESTS}/test_[x-z]*.py"
    )
    config.data.weight_stages = ((200, {"stdlib": 0.5, "tests": 0.5}),)
    return with_variant(config, variant, VARIANTS)
