#!/usr/bin/env bash
# Builds everything and runs every test: CPU tests always; GPU tests run on a GPU and are
# reported as skipped ("no CUDA GPU") elsewhere; the Python tests that need PyTorch skip, and say
# so, where it is not installed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ctest --test-dir build --output-on-failure -j"$(nproc)"
# ctest lists skipped tests without their reason; gtest prints it under "<file>:<line>: Skipped".
log=build/Testing/Temporary/LastTest.log
if grep -q ': Skipped$' "$log" 2>/dev/null; then
  echo "skipped tests, by reason:"
  grep -A1 ': Skipped$' "$log" | grep -v -e ': Skipped$' -e '^--$' | sort | uniq -c | sort -rn
fi
if python3 -c 'import pytest' 2>/dev/null; then
  python3 -m pytest -q -rs tests/python  # -rs: every skip with its reason
else
  echo "Python tests not run: pytest is not installed here"
fi
