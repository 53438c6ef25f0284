#!/usr/bin/env bash
# Download, into ./.whlt (run from the project root), the wheels the GPU machines (Python 3.12, manylinux
# x86_64, torch 2.11 in their image) lack for benchmark.impl=torchtitan and bench/peers/torchtitan_train.py:
# torchtitan 0.2.2 and what its llama3 package imports (tyro and its two needs, torchdata, and datasets
# with dill and multiprocess: llama3's package imports torchtitan's dataset module). Everything else it
# imports (tokenizers, tensorboard, huggingface-hub, pyarrow, pandas, xxhash, fsspec, requests) is in the
# image. No torch. The versions are the ones the CPU tests run with.
#
#   bash bench/gpu/titan_wheels.sh
#
# Then, in each GPU call: carry [".whlt"] (with the project's own .whl, if any) and start the command with
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whlt/*.whl \
#     && export PYTHONPATH=/tmp/site:$PWD || exit;
set -euo pipefail
WANT=(
  torchtitan==0.2.2
  tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1
  torchdata==0.11.0
  datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
)
rm -rf .whlt && mkdir -p .whlt
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -d .whlt "${WANT[@]}"
ls .whlt
du -sh .whlt
