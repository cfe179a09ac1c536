#!/usr/bin/env bash
# Everything gpud needs a GPU for, in one call on the device machine: the CUDA tests, the
# benchmarks (cuda, transport, clients on cuda, webgpu through the NVIDIA Vulkan driver) and a
# daemon profile. Results go to $OUT (log.txt plus JSON files).
#
# Prepare once, on the machine that sends the call (both folders are ignored by git):
#   .whl/  wheels the device machine lacks (made with `pip download --python-version 3.12 ...`):
#          anyio sniffio typing_extensions pytest pluggy pytest-asyncio pyzmq wgpu rendercanvas cffi pycparser
#   .gl/   Debian's libvulkan1 and friends (device/README.md), for wgpu's Vulkan backend
#   .embed/ all-MiniLM-L6-v2's float16 weights and tokenizer (scripts/prepare-embed-weights.sh), for `embed`
# and call: bash scripts/device-check.sh [sections...]   (default: all)
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpud-device-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 GPUD_CACHE_DIR=/tmp/gpud-cache
SECTIONS=${*:-tests cuda replay transport clients webgpu launch}
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1  # the image's own pytest plugins are not ours

setup() {
    if compgen -G ".whl/*.whl" >/dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl ||
            return 1
    fi
    if compgen -G ".gl/*.deb" >/dev/null; then
        for f in .gl/*.deb; do dpkg -x "$f" /; done
        ldconfig
    fi
    local icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    [ -f "$icd" ] && export VK_DRIVER_FILES=$icd
    export PYTHONPATH=/tmp/site:$PWD/protocol:$PWD/client:$PWD
    nvidia-smi -L
    python3 -c 'import sys, numpy
from cuda.bindings import driver, nvrtc
print("python", sys.version.split()[0], "numpy", numpy.__version__, "driver", driver.cuDriverGetVersion()[1])'
}

section() {
    echo
    echo "== $*"
    "$@"
}

main() {
    local status=0
    setup || return 1
    for name in $SECTIONS; do
        case $name in
        tests) section python3 -m pytest -q -p no:cacheprovider -p pytest_asyncio.plugin -m cuda tests || status=1 ;;
        hostile) section python3 -m pytest -q -p no:cacheprovider -p pytest_asyncio.plugin -m cuda tests/test_hostile.py || status=1 ;;
        replay)
            section python3 -m gpud bench replay --backend cuda --json "$OUT/bench-replay-cuda.json" || status=1
            ;;
        devices) # several GPUs: every cuda test, and the clients spread over them
            section python3 -m gpud bench clients --backend cuda --devices all --seconds 3 --json "$OUT/bench-clients-devices.json" || status=1
            ;;
        devices-heavy) # the same, with GPU-bound steps (16M floats per tensor)
            section python3 -m gpud bench clients --backend cuda --devices all --size 16777216 --clients 2,4,8 --seconds 3 --json "$OUT/bench-clients-devices-heavy.json" || status=1
            ;;
        devices-ppd) # several GPUs, a process per device (#18): light and GPU-bound steps, beside one process for all
            for flag in "" --process-per-device; do
                tag=$([ -n "$flag" ] && echo ppd || echo one)
                section python3 -m gpud bench clients --backend cuda --devices all $flag --seconds 3 \
                    --json "$OUT/bench-clients-devices-$tag.json" || status=1
                section python3 -m gpud bench clients --backend cuda --devices all $flag --size 16777216 --clients 2,4,8 \
                    --seconds 3 --json "$OUT/bench-clients-devices-heavy-$tag.json" || status=1
            done
            ;;
        devices-light) # light steps only (4,096 floats): one process for every device, then a process per device
            for flag in "" --process-per-device; do
                tag=$([ -n "$flag" ] && echo ppd || echo one)
                section python3 -m gpud bench clients --backend cuda --devices all $flag --seconds 3 \
                    --json "$OUT/bench-clients-devices-$tag.json" || status=1
            done
            ;;
        devices-light-ring) # the same with every client on the shared-memory ring (GPUD_RING=1): faster clients
            for flag in "" --process-per-device; do
                tag=$([ -n "$flag" ] && echo ppd || echo one)
                GPUD_RING=1 section python3 -m gpud bench clients --backend cuda --devices all $flag --seconds 3 \
                    --json "$OUT/bench-clients-devices-ring-$tag.json" || status=1
            done
            ;;
        devices-decode) # decode clients spread over every device (the weights once per device), beside one device
            for spread in 0 all; do
                section python3 -m gpud bench decode --backend cuda --devices "$spread" --clients 1,2,4,8 --modes graph,merged \
                    --json "$OUT/bench-decode-devices-$spread.json" || status=1
            done
            ;;
        devices-decode-ppd) # the same decode clients over every device, a process per device (#18)
            section python3 -m gpud bench decode --backend cuda --devices all --process-per-device --clients 1,2,4,8 \
                --modes graph,merged --json "$OUT/bench-decode-devices-ppd.json" || status=1
            ;;
        cuda) section python3 -m gpud bench cuda --json "$OUT/bench-cuda.json" || status=1 ;;
        profile) # the daemon under cProfile (slower: never mix with measured runs)
            GPUD_DAEMON_ARGS="--profile $OUT/daemon-cuda.prof" section python3 -m gpud bench cuda --quick || status=1
            python3 -c "import pstats; pstats.Stats('$OUT/daemon-cuda.prof').sort_stats('tottime').print_stats(25)" | tail -40
            ;;
        profile-clients) # the daemon under cProfile while 2 and 4 clients run light steps on one device (what bounds a worker)
            GPUD_DAEMON_ARGS="--profile $OUT/daemon-clients.prof" section python3 -m gpud bench clients --backend cuda \
                --clients 2,4 --seconds 3 || status=1
            python3 -c "import pstats; pstats.Stats('$OUT/daemon-clients.prof').sort_stats('tottime').print_stats(40)" | tail -55
            ;;
        transport) section python3 -m gpud bench transport --backend cuda --json "$OUT/bench-transport.json" || status=1 ;;
        clients) section python3 -m gpud bench clients --backend cuda --seconds 3 --json "$OUT/bench-clients-cuda.json" || status=1 ;;
        webgpu)
            section python3 -m gpud bench webgpu --json "$OUT/bench-webgpu-vulkan.json" || status=1
            section python3 -m gpud bench replay --backend webgpu --json "$OUT/bench-replay-webgpu-vulkan.json" || status=1
            section python3 -m gpud bench clients --backend webgpu --seconds 3 --json "$OUT/bench-clients-webgpu-vulkan.json" || status=1
            section python3 -m benchmarks.webgpu_encode --json "$OUT/webgpu-encode-vulkan.json" || status=1
            ;;
        launch) section python3 -m benchmarks.cuda_launch --json "$OUT/launch-cuda.json" || status=1 ;;
        ops) section python3 -m gpud bench ops --json "$OUT/bench-ops.json" || status=1 ;;
        wgsl-matmul) # the WGSL matmul before and after, through the NVIDIA Vulkan driver
            section python3 -m benchmarks.wgsl_matmul --dtypes all --json "$OUT/bench-wgsl-matmul-vulkan.json" || status=1
            ;;
        decode) section python3 -m gpud bench decode --backend cuda --clients 1,4,8 --json "$OUT/bench-decode-cuda.json" || status=1 ;;
        decode-quick) section python3 -m gpud bench decode --backend cuda --quick --clients 1 --json "$OUT/bench-decode-quick.json" || status=1 ;;
        sharing) # the replay modes that share the GPU: a window of 16 tokens a message, one merged step (K up to 32)
            section python3 -m gpud bench decode --backend cuda --clients 1,4,8,16,32 --modes graph,window,merged \
                --json "$OUT/bench-decode-sharing-cuda.json" --plot "$OUT/decode-sharing-cuda.svg" || status=1
            section python3 -m pytest -q -p no:cacheprovider -p pytest_asyncio.plugin -m cuda tests/session tests/service/test_rings.py tests/testing/test_transformer.py || status=1
            ;;
        sharing-webgpu) # the same through the NVIDIA Vulkan driver (races lavapipe hides)
            section python3 -m gpud bench decode --backend webgpu --clients 1,4,8 --modes graph,window,merged \
                --json "$OUT/bench-decode-sharing-webgpu-vulkan.json" || status=1
            ;;
        decode-webgpu)
            section python3 -m gpud bench decode --backend webgpu --clients 1,4 --json "$OUT/bench-decode-webgpu-vulkan.json" || status=1
            ;;
        profile-decode) # the daemon under cProfile while one client decodes coalesced
            GPUD_DAEMON_ARGS="--profile $OUT/daemon-decode.prof" section python3 -m gpud bench decode --backend cuda --quick --clients 1 --modes coalesced || status=1
            python3 -c "import pstats; pstats.Stats('$OUT/daemon-decode.prof').sort_stats('tottime').print_stats(30)" | tail -45
            ;;
        demo) section python3 -m gpud demo --backend cuda --clients 3 || status=1 ;;
        embed) # all-MiniLM-L6-v2: carry .embed (scripts/prepare-embed-weights.sh); transformers is in the image
            section python3 -m pytest -q -p no:cacheprovider -p pytest_asyncio.plugin -m cuda tests/testing/test_bert.py || status=1
            section python3 -m gpud demo embed --backend cuda --clients 3 --weights .embed || status=1
            section python3 -m gpud bench embed --backend cuda --weights .embed --json "$OUT/bench-embed-cuda.json" || status=1
            ;;
        soak) # K clients (SOAK_CLIENTS, 4) for SOAK_MINUTES (8) of decode, ops, replays, residents and kills
            section python3 -m gpud bench soak --backend cuda --clients "${SOAK_CLIENTS:-4}" --minutes "${SOAK_MINUTES:-8}" \
                --json "$OUT/soak-cuda.json" --plot "$OUT/soak-cuda.svg" || status=1
            ;;
        embed-profile) # kernel times of one MiniLM forward at 256 sentences, gpud's and torch's (Nsight Compute)
            section ncu --target-processes all --metrics gpu__time_duration.sum --csv --log-file "$OUT/ncu-embed.csv" \
                python3 -m benchmarks.embed_profile --weights .embed || status=1
            section python3 -m benchmarks.embed_profile --report "$OUT/ncu-embed.csv" || status=1
            ;;
        gemm) # the tensor-core matmuls beside cuBLAS: matmul_tc's tiles, then matmul_wg's (sm_90a)
            section python3 benchmarks/gemm_harness.py --json "$OUT/gemm-harness.json" || status=1
            section python3 benchmarks/wg_harness.py --json "$OUT/wg-harness.json" || status=1
            ;;
        fused) # the fused decode kernels (written and NVRTC-checked without a GPU) first, then the decode on them
            section python3 -m pytest -q -p no:cacheprovider -p pytest_asyncio.plugin -m cuda tests/ops/test_fused.py tests/testing/test_transformer.py || status=1
            section python3 -m gpud bench decode --backend cuda --quick --clients 1,4 --modes coalesced,graph --json "$OUT/bench-decode-fused.json" || status=1
            ;;
        merged) # merged decode steps only, K up to 32 (their matmuls in groups of 8 rows past 8)
            section python3 -m gpud bench decode --backend cuda --clients 1,8,16,32 --modes merged \
                --json "$OUT/bench-decode-merged-cuda.json" || status=1
            ;;
        matvec-tc) # float32 rows by 16-bit Linear weights on the tensor cores: tests, then the kernel beside matvec and cuBLAS
            section python3 -m pytest -q -p no:cacheprovider -p pytest_asyncio.plugin -m cuda tests/ops/test_matvec_tc.py \
                tests/ops/test_matmul.py tests/ops/test_matmul_bf16.py || status=1
            section python3 benchmarks/matvec_tc_harness.py --json "$OUT/matvec-tc-harness.json" || status=1
            ;;
        decode-ab) # decode before and after a change, alternating on this machine: .ab/base holds the earlier tree
            # (made with `git archive <commit> | tar -x -C .ab/base`, carried), this tree is the later one
            # ("new"); any other name in AB_RUNS is the tree .ab/<name>
            local i=0
            for run in ${AB_RUNS:-base new base new}; do
                local tree=$PWD
                i=$((i + 1))
                [ "$run" != new ] && tree=$PWD/.ab/$run
                (cd "$tree" && PYTHONPATH=/tmp/site:$tree/protocol:$tree/client:$tree section python3 -m gpud bench decode \
                    --backend cuda --clients ${DECODE_CLIENTS:-1,8,32} --modes ${DECODE_MODES:-graph,window,merged} \
                    --json "$OUT/decode-ab-$run-$i.json") || status=1
            done
            ;;
        weights-early) # matvec_ro as landed in session 13 (not yet run on a GPU): its tests and those of the
            # kernels it shares code with; then time it with `AB_RUNS="base new base new" DECODE_CLIENTS=1
            # DECODE_MODES=window bash scripts/device-check.sh weights-early decode-ab` (.ab/base: e0fd876)
            section python3 -m pytest -q -p no:cacheprovider -p pytest_asyncio.plugin -m cuda tests/ops/test_matvec_ro.py \
                tests/ops/test_norm_matmul.py tests/ops/test_matmul.py tests/testing/test_transformer.py \
                tests/test_hostile.py || status=1
            ;;
        attention-loads) # session 14's batched loads in CUDA attention (run once, one alternation) and its split count
            # in graphs of rows (not yet timed): every cuda test of the ops and the decode workload, then
            # `AB_RUNS="base new base new" DECODE_CLIENTS=1,32 DECODE_MODES=window,merged-window` decode-ab (.ab/base: b703402)
            section python3 -m pytest -q -p no:cacheprovider -p pytest_asyncio.plugin -m cuda tests/ops tests/testing || status=1
            ;;
        pdl) # the graph runner's tests, programmatic edges and full ones
            section python3 -m pytest -q -p no:cacheprovider -p pytest_asyncio.plugin -m cuda tests/backends/cuda/test_device.py -k graph || status=1
            ;;
        encode) section python3 -m benchmarks.webgpu_encode --json "$OUT/webgpu-encode-vulkan.json" || status=1 ;;
        pdl-ab) # decode with programmatic dependent launch in graphs (the default) and without, alternating
            for run in on off on off; do
                local flag=""
                [ "$run" = off ] && flag="--no-graph-pdl"
                GPUD_DAEMON_ARGS="$flag" section python3 -m gpud bench decode --backend cuda --clients 1 --modes graph,window \
                    --json "$OUT/pdl-$run-single.json" || status=1
                GPUD_DAEMON_ARGS="$flag" section python3 -m gpud bench decode --backend cuda --clients 8,32 --modes merged \
                    --json "$OUT/pdl-$run-merged.json" || status=1
            done
            ;;
        decode-profile) # kernel times of one decode step of 1 and of 16 sequences, gpud's and torch's (Nsight Compute)
            for b in 1 16; do
                section ncu --target-processes all --clock-control none --metrics gpu__time_duration.sum --csv \
                    --log-file "$OUT/ncu-decode-b$b.csv" python3 -m benchmarks.decode_profile --batch "$b" >/dev/null || status=1
                section python3 -m benchmarks.decode_profile --report "$OUT/ncu-decode-b$b.csv" || status=1
            done
            ;;
        ring-decode) # the decode clients over the shared-memory ring (GPUD_RING=1) beside ZeroMQ, alternating
            for run in zmq-1 ring-1 zmq-2 ring-2; do
                GPUD_RING=$([ "${run%-*}" = ring ] && echo 1 || echo 0) section python3 -m gpud bench decode --backend cuda \
                    --clients 1,8 --modes graph,window --json "$OUT/decode-$run.json" || status=1
            done
            ;;
        surface) # the numpy surface on both backends (cuda, and webgpu through the NVIDIA Vulkan driver)
            section python3 -m pytest -q -p no:cacheprovider -p pytest_asyncio.plugin tests/ops/test_reduce_nan.py \
                tests/ops/test_compare.py tests/ops/test_elementwise.py tests/ops/test_casts.py tests/ops/test_joining.py \
                tests/ops/test_matmul_numpy.py tests/ops/test_reduce_keepdims.py tests/ops/test_written_as_numpy.py \
                tests/ops/test_power.py tests/ops/test_indexing.py tests/ops/test_stats.py tests/testing/test_picogpt.py \
                tests/client/test_operands.py tests/client/test_operators.py || status=1
            ;;
        picogpt) # picoGPT's numpy GPT-2 at 124M (random weights): numpy, gpud eager on cuda and on Vulkan, torch eager
            section python3 -m benchmarks.picogpt --backend cuda --shape 124M --json "$OUT/bench-picogpt-124M-cuda.json" || status=1
            section python3 -m benchmarks.picogpt --backend webgpu --shape 124M --json "$OUT/bench-picogpt-124M-webgpu.json" || status=1
            ;;
        embed-ring) # the MiniLM benchmark with every client on the shared-memory ring
            GPUD_RING=1 section python3 -m gpud bench embed --backend cuda --weights .embed --json "$OUT/bench-embed-cuda-ring.json" || status=1
            ;;
        replay-stages) # MiniLM-shaped replays' round-trip stages over ZeroMQ and the ring (random weights: no .embed),
            # then the hostile-input test on CUDA, which session 15 could not rerun after its warm-up fix
            section python3 -m benchmarks.replay_stages --backend cuda --json "$OUT/replay-stages-cuda.json" || status=1
            section python3 -m pytest -q -p no:cacheprovider -p pytest_asyncio.plugin -m cuda tests/test_hostile.py \
                tests/service/test_rings.py || status=1
            ;;
        embed-trace) # the MiniLM benchmark with the replay's stages (a daemon with --trace), over ZeroMQ and the ring
            GPUD_DAEMON_ARGS=--trace section python3 -m gpud bench embed --backend cuda --weights .embed \
                --json "$OUT/bench-embed-cuda-trace.json" || status=1
            GPUD_RING=1 GPUD_DAEMON_ARGS=--trace section python3 -m gpud bench embed --backend cuda --weights .embed \
                --json "$OUT/bench-embed-cuda-trace-ring.json" || status=1
            ;;
        fusions) # matmul's epilogue activation and the residual add + layernorm: their tests, then MiniLM with stages
            section python3 -m pytest -q -p no:cacheprovider -p pytest_asyncio.plugin -m cuda tests/ops/test_matmul_activation.py \
                tests/ops/test_add_layernorm.py tests/ops/test_matmul_tma.py tests/ops/test_matmul_wg.py tests/ops/test_elementwise.py \
                tests/ops/test_elementwise16.py tests/ops/test_reduce_warp.py tests/client/test_nn.py tests/testing/test_bert.py || status=1
            GPUD_DAEMON_ARGS=--trace section python3 -m gpud bench embed --backend cuda --weights .embed \
                --json "$OUT/bench-embed-cuda-fusions.json" || status=1
            ;;
        replay-profile) # one client replaying MiniLM: its calls under cProfile, the daemon under its --profile
            for n in 16 256; do
                GPUD_DAEMON_ARGS="--profile $OUT/daemon-embed-replay-$n.prof" section python3 -m benchmarks.embed_replay \
                    --weights .embed --sentences "$n" --reps 300 || status=1
                python3 -c "import pstats; pstats.Stats('$OUT/daemon-embed-replay-$n.prof').sort_stats('tottime').print_stats(30)" | tail -45
            done
            ;;
        compile-time) # a fresh kernel cache: the first MiniLM replay compiles the op library's families it uses
            GPUD_CACHE_DIR=$(mktemp -d) section python3 -m benchmarks.embed_replay --weights .embed --sentences 16 --reps 20 ||
                status=1
            ;;
        picogpt-cuda) section python3 -m benchmarks.picogpt --backend cuda --shape 124M --json "$OUT/bench-picogpt-124M-cuda.json" || status=1 ;;
        tma) # the TMA matmuls (matmul_tma): their cuda tests, the backend's, then bench ops (the op's choice beside cuBLAS)
            section python3 -m pytest -q -p no:cacheprovider -p pytest_asyncio.plugin -m cuda tests/ops/test_matmul_tma.py \
                tests/ops/test_matmul_wg.py tests/ops/test_matmul_tc.py tests/backends/cuda tests/testing/test_bert.py || status=1
            section python3 -m gpud bench ops --json "$OUT/bench-ops.json" || status=1
            ;;
        splitk) # split-K for the TMA matmuls (matmul_tmak): its cuda tests and the op's, bench ops, the sweep of split counts
            section python3 -m pytest -q -p no:cacheprovider -p pytest_asyncio.plugin -m cuda tests/ops/test_matmul_tmak.py \
                tests/ops/test_matmul_tma.py tests/ops/test_matmul_activation.py tests/ops/test_matmul_tc.py \
                tests/backends/cuda/test_tma.py || status=1
            section python3 -m gpud bench ops --json "$OUT/bench-ops-splitk.json" || status=1
            section python3 -m benchmarks.splitk_sweep --json "$OUT/splitk-sweep.json" || status=1
            ;;
        gemm-sweep) # every tensor-core matmul kernel at every point of README's GEMM table, beside cuBLAS and the op's pick
            section python3 -m benchmarks.gemm_sweep --json "$OUT/gemm-sweep.json" || status=1
            ;;
        gemm-s8) # session 8's matmul changes: the tile refit, 128 x 64 TMA tiles, the TMA kernels' bulk tile store
            section python3 -m pytest -q -p no:cacheprovider -p pytest_asyncio.plugin -m cuda tests/ops/test_matmul_tc.py \
                tests/ops/test_matmul_wg.py tests/ops/test_matmul_tma.py tests/ops/test_matmul_tmak.py \
                tests/ops/test_matmul_activation.py tests/backends/cuda/test_tma.py tests/testing/test_bert.py || status=1
            section python3 -m benchmarks.gemm_sweep --json "$OUT/gemm-sweep.json" || status=1
            GPUD_DAEMON_ARGS=--trace section python3 -m gpud bench embed --backend cuda --weights .embed \
                --json "$OUT/bench-embed-cuda.json" || status=1
            ;;
        ab) # BASE=DIR (a tree of an earlier commit beside this one, e.g. `git archive C | tar -x -C DIR`):
            # MiniLM with the replay's stages and the quick decode, alternating that tree and this one
            for round in ${ROUNDS:-1 2}; do
                for tree in "$BASE" .; do
                    tag=$([ "$tree" = . ] && echo new || echo base)
                    (cd "$tree" && PYTHONPATH=/tmp/site:$PWD/protocol:$PWD/client:$PWD GPUD_DAEMON_ARGS=--trace section \
                        python3 -m gpud bench embed --backend cuda --weights "$OLDPWD/.embed" \
                        --json "$OUT/bench-embed-$tag-$round.json") || status=1
                    (cd "$tree" && PYTHONPATH=/tmp/site:$PWD/protocol:$PWD/client:$PWD section \
                        python3 -m gpud bench decode --backend cuda --quick --clients 1 \
                        --json "$OUT/decode-quick-$tag-$round.json") || status=1
                done
            done
            ;;
        tma-tests) # the TMA matmuls' cuda tests (every tile of matmul_tma and matmul_tmak, the epilogue activation, the maps)
            section python3 -m pytest -q -p no:cacheprovider -p pytest_asyncio.plugin -m cuda tests/ops/test_matmul_tma.py \
                tests/ops/test_matmul_activation.py tests/ops/test_matmul_tmak.py tests/backends/cuda || status=1
            ;;
        final) # the last kernels of session 6 on cuda (the warp layernorm, the 16-byte elementwise ops) and the
            # WGSL tanh through the NVIDIA Vulkan driver (these files run on both backends)
            section python3 -m pytest -q -p no:cacheprovider -p pytest_asyncio.plugin tests/ops/test_elementwise.py \
                tests/ops/test_bfloat16.py tests/ops/test_elementwise16.py tests/ops/test_reduce_warp.py || status=1
            ;;
        changed) # this session's changed op paths on cuda
            section python3 -m pytest -q -p no:cacheprovider -p pytest_asyncio.plugin -m cuda tests/ops/test_power.py \
                tests/ops/test_reduce_keepdims.py tests/ops/test_matmul_numpy.py tests/ops/test_layout.py tests/ops/test_reduce.py || status=1
            ;;
        vulkan-probe) # what the NVIDIA Vulkan adapter offers WGSL (shader-f16, subgroups, cooperative matrices)
            section python3 -c 'import wgpu
for a in wgpu.gpu.enumerate_adapters_sync():
    print(a.info.get("device"), a.info.get("backend_type"), sorted(a.features))
    print({k: v for k, v in a.limits.items() if "subgroup" in k or "workgroup" in k})' || status=1
            ;;
        embed-webgpu) # MiniLM through the NVIDIA Vulkan driver, beside torch (issue #15: within 3x of the cuda backend)
            section python3 -m gpud bench embed --backend webgpu --weights .embed --json "$OUT/bench-embed-webgpu-vulkan.json" || status=1
            ;;
        optests) section python3 -m pytest -q -p no:cacheprovider -p pytest_asyncio.plugin -m cuda tests/ops tests/testing tests/client || status=1 ;;
        *) echo "unknown section $name" && status=1 ;;
        esac
    done
    return $status
}

main 2>&1 | tee "$OUT/log.txt"
exit "${PIPESTATUS[0]}"
