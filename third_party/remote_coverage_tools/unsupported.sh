#!/bin/sh
echo "coverage unsupported: bazel coverage is not available offline; use pytest-cov" >&2
exit 1
