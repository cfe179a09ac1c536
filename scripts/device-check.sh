#!/usr/bin/env bash
# CUDA tests and launch benchmarks on a machine with an NVIDIA GPU; everything goes to $OUT/log.txt.
#
# Packages that machine lacks travel as wheels in .whl/ (ignored by git), made here with:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl anyio sniffio idna typing_extensions pytest-asyncio pyzmq wgpu rendercanvas cffi pycparser
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpud-device-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

main() {
    local status=0
    if compgen -G ".whl/*.whl" >/dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl ||
            return 1
    else
        echo "no wheels in .whl/: using the packages installed here"
    fi
    export PYTHONPATH=/tmp/site:$PWD/protocol:$PWD/client:$PWD
    nvidia-smi -L
    python3 -c 'import sys, pytest, numpy
from cuda.bindings import driver, nvrtc
print("python", sys.version.split()[0], "pytest", pytest.__version__, "numpy", numpy.__version__,
      "driver", driver.cuDriverGetVersion()[1], "nvrtc", nvrtc.nvrtcVersion()[1:])' || status=1

    echo "== pytest -m cuda"
    python3 -m pytest -q -p no:cacheprovider -m cuda --continue-on-collection-errors tests || status=1

    echo "== launch overhead"
    python3 scripts/bench_cuda_launch.py --json "$OUT/launch-cuda.json" || status=1

    if [ -f gpud/bench/cuda.py ]; then
        echo "== gpud bench cuda"
        python3 -m gpud bench cuda --json "$OUT/bench-cuda.json" || status=1
    else
        echo "== gpud bench cuda: skipped, gpud/bench/cuda.py does not exist yet"
    fi
    return $status
}

main 2>&1 | tee "$OUT/log.txt"
exit "${PIPESTATUS[0]}"
