"""`python -m meltemi.levanter.harness ...`: lm-eval's command line with `meltemi` registered."""

import sys

from meltemi.levanter.harness import MeltemiLM  # noqa: F401  (registers --model meltemi)


def main() -> None:
    from lm_eval.__main__ import cli_evaluate

    sys.argv[0] = "lm_eval"
    cli_evaluate()


if __name__ == "__main__":
    main()
