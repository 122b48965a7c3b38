"""Makes `lm_eval --model meltemi` work: registers the model when lm-eval loads its models.

lm-eval 0.4 finds models only in its own `lm_eval.models.MODEL_MAPPING` (no plugin entry
points). The opt-in meltemi-lm-eval wheel ships `meltemi_lm_eval.pth`, whose one line imports
this module at interpreter start-up; all it does then is put a finder on `sys.meta_path` that
waits for `lm_eval.models` to finish importing and then registers the lazy placeholder
`"meltemi" -> "meltemi.levanter.harness._model:MeltemiLM"`, exactly as lm-eval registers its
own models. Nothing of lm-eval, JAX or Meltemi is imported before lm-eval itself asks for a
model named `meltemi`. Without this wheel, `python -m meltemi.levanter.harness` is lm-eval's
command line with the model registered.
"""

import sys

MODEL_NAME = "meltemi"
TARGET = "meltemi.levanter.harness._model:MeltemiLM"
WATCHED = "lm_eval.models"


def register() -> None:
    """Registers `MODEL_NAME` in lm-eval's model registry (unless something already did)."""
    try:
        from lm_eval.api.registry import model_registry

        if MODEL_NAME not in model_registry:
            model_registry.register(MODEL_NAME, target=TARGET)
    except Exception as err:  # an lm-eval whose registry changed must still run its own models
        print(
            f"meltemi-lm-eval: could not register lm-eval model {MODEL_NAME!r} ({err!r}); "
            "run `python -m meltemi.levanter.harness ...` instead of `lm_eval ...`",
            file=sys.stderr,
        )


class _RegisteringLoader:
    """Runs the real loader of `lm_eval.models`, then `register()`."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        register()

    def __getattr__(self, name):  # get_source, get_resource_reader, ...: the real loader's
        return getattr(self._loader, name)


class Finder:
    """A `sys.meta_path` finder that answers only for `lm_eval.models`, once."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name != WATCHED:
            return None
        sys.meta_path.remove(cls)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _RegisteringLoader(spec.loader)
                return spec
        return None


def install() -> None:
    """Puts `Finder` first on `sys.meta_path` (once); registers now if lm-eval is loaded."""
    if "lm_eval.models" in sys.modules:
        register()
    elif Finder not in sys.meta_path:
        sys.meta_path.insert(0, Finder)


install()
