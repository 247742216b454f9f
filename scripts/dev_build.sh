#!/usr/bin/env bash
# Build the C++ core in place for development: python/ds4/_core*.so, then run tests with
#   PYTHONPATH=python python -m pytest tests/...
# (No pip install needed; CI uses `pip install -e .[test]` instead.)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build/dev}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} \
      -DDS4_DEV_OUTPUT_DIR="$PWD/python/ds4" >/dev/null
cmake --build "$BUILD_DIR" -j "${JOBS:-2}"
