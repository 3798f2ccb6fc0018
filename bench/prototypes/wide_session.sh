#!/usr/bin/env bash
# 256-row cooperative tiles and clusters on few tiles (issue 17, the sweep's last 0.5%), one of
# STEP=
#   probe  the 256-row tiles' GPU tests (tests/gpu/test_hopper_gpu.py -k 256); wide_probe.py
#          --part tiles small; compute-sanitizer on 256x128 on a cluster 2x1 at ragged sizes
#          (the first visits, bench/logs/wide/, ran 256x160 there with its rules relaxed)
#   rule   wide_probe.py --part rule (the wave model with 256x128 against without);
#          compute-sanitizer as in probe; the whole `pytest -m gpu` but the tune suite, as in
#          tests (up to 300 s)
#   cola   wide_probe.py --part cola (a column-major A on each cluster)
#   colarule  the line rule's GPU test, its column-major A cases new; compute-sanitizer on a
#          column-major A at 2199x4008x1000 (the rule's cluster 2x1)
#   tuned  the tune suite; bench/defaults.py --part 3 --tuned (the sweep after kgen tune, f16)
#   tests  the whole `pytest -m gpu` in one visit: pytest-xdist over 14 workers (carried in
#          .whl by ../shared/gpu/prepare.sh pytest-xdist execnet), then the tune suite alone
#          (it times candidates on every CPU core, and its 60 s bound is a wall-clock one)
# Run: STEP=... bash .gpu/device-run.sh bash bench/prototypes/wide_session.sh
. "$(dirname "$0")/../session_head.sh"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/device.log"
case ${STEP:-probe} in
probe)
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_hopper_gpu.py \
    -k "256" 2>&1 | tail -8 | tee "$OUT/pytest_256.log"
  timeout 330 python3 bench/prototypes/wide_probe.py --part ${PARTS:-tiles small} 2>&1 | grep -v -i warn \
    | tee "$OUT/wide_probe.log"
  python3 -c 'import sys; sys.path.insert(0, "bench"); from defaults import BARE; print(BARE.format(t="f16"))' \
    | sed "s/accumulate f32 {/accumulate f32 {\n    tile 256x128x64\n    warps 2x4\n    stages 4\n    cluster 2x1/" > /tmp/wide.kg
  sanitize /tmp/wide.kg "$(grep -m1 -E 'tile|tensor A' /tmp/wide.kg)" ;;
rule)
  timeout 200 python3 bench/prototypes/wide_probe.py --part rule 2>&1 | grep -v -i warn \
    | tee "$OUT/wide_rule.log"
  python3 -c 'import sys; sys.path.insert(0, "bench"); from defaults import BARE; print(BARE.format(t="f16"))' \
    | sed "s/accumulate f32 {/accumulate f32 {\n    tile 256x128x64\n    warps 2x4\n    stages 4\n    cluster 2x1/" > /tmp/wide.kg
  sanitize /tmp/wide.kg "$(grep -m1 -E 'tile|tensor A' /tmp/wide.kg)"
  # -v: each result as it lands, kept whole in the log even if the time runs out
  timeout 300 python3 -m pytest -v -m gpu -p no:cacheprovider -n 14 tests/gpu \
    --ignore=tests/gpu/test_tune_gpu.py > "$OUT/pytest_gpu_xdist.log" 2>&1
  echo "pytest exit $?"; grep -E "FAILED|ERROR" "$OUT/pytest_gpu_xdist.log" | head -20
  grep -c PASSED "$OUT/pytest_gpu_xdist.log"; tail -3 "$OUT/pytest_gpu_xdist.log" ;;
cola)
  timeout 330 python3 bench/prototypes/wide_probe.py --part cola 2>&1 | grep -v -i warn \
    | tee "$OUT/wide_cola.log" ;;
colarule)  # the line rule's GPU test (a column-major A among its cases); sanitizer on one
  timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_builder_gpu.py \
    -k split_lines 2>&1 | tail -6 | tee "$OUT/pytest_cola.log"
  python3 -c 'import sys; sys.path.insert(0, "bench"); from defaults import BARE; print(BARE.format(t="f16"))' \
    | sed "s/\[M, K\] row/[M, K] col/" > /tmp/wide.kg
  sanitize /tmp/wide.kg "$(grep -m1 -E 'tile|tensor A' /tmp/wide.kg)" ;;
tuned)  # the tune suite, then issue 17's sweep after kgen tune at each shape (f16)
  timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_tune_gpu.py 2>&1 \
    | tail -8 | tee "$OUT/pytest_gpu_tune.log"
  timeout 400 python3 bench/defaults.py --part 3 --tuned --dtype f16 --json "$OUT/sweep_tuned.json" \
    2>&1 | grep -v -i warn | tee "$OUT/sweep_tuned.log" ;;
tests)
  timeout 420 python3 -m pytest -q -m gpu -p no:cacheprovider -n 14 tests/gpu \
    --ignore=tests/gpu/test_tune_gpu.py 2>&1 | tail -30 | tee "$OUT/pytest_gpu_xdist.log"
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_tune_gpu.py 2>&1 \
    | tail -8 | tee "$OUT/pytest_gpu_tune.log" ;;
esac
