"""`bazel run //fray:status [-- --cluster DIR | --json | --demo]`: lists fray actors."""

import sys

from meltemi.fray._status import main

if __name__ == "__main__":
    sys.exit(main())
