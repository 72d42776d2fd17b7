#!/usr/bin/env bash
# Builds everything and runs every test: CPU tests always; GPU tests run on a GPU and are
# reported as skipped ("no CUDA GPU") elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ctest --test-dir build --output-on-failure -j"$(nproc)"
if python3 -c 'import torch, pytest' 2>/dev/null; then
  python3 -m pytest -q tests/python
else
  echo "Python tests not run: PyTorch or pytest is not installed here"
fi
