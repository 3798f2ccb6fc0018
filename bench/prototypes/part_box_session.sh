#!/usr/bin/env bash
# Tiles whose N is not a multiple of 64 on the cooperative kernel (issue 17), one of STEP=
#   probe  their GPU tests (tests/gpu/test_hopper_gpu.py and test_staged_input_gpu.py, -k x160
#          or x96); part_box_probe.py --part tiles fused; compute-sanitizer on 256x160 s3 at
#          ragged sizes, bare and fused (C through the staging)
#   rule   part_box_probe.py --part rule (the wave model with 256x192 and 256x176 against
#          without); the whole `pytest -m gpu` under pytest-xdist but the tune suite, then that
#          alone; bench/defaults.py --part 3 (the sweep, no schedule line)
#   narrow their GPU tests (-k x152); part_box_probe.py --part narrow; compute-sanitizer on
#          256x152 s4, bare and fused
#   final  part_box_probe.py --part rule152; bench/defaults.py --part 3 (the sweep, no schedule
#          line); the whole `pytest -m gpu` under pytest-xdist but the tune suite
# Run: STEP=... bash .gpu/device-run.sh bash bench/prototypes/part_box_session.sh
. "$(dirname "$0")/../session_head.sh"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/device.log"
kg() {  # the bare (or fused) kernel with tile $2 and stages $3
  python3 -c "import sys; sys.path[:0] = ['bench', 'bench/prototypes']; from defaults import BARE; from misaligned_probe import FUSED; print(BARE.format(t='f16') if '$1' == 'bare' else FUSED)" \
    | sed "s/accumulate f32 {/accumulate f32 {\n    tile $2\n    warps 2x4\n    stages $3/" > /tmp/part.kg
}
case ${STEP:-probe} in
probe)
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_hopper_gpu.py \
    tests/gpu/test_staged_input_gpu.py -k "x160 or x96" 2>&1 | tail -8 | tee "$OUT/pytest_part.log"
  timeout 420 python3 bench/prototypes/part_box_probe.py --part ${PARTS:-tiles fused} 2>&1 \
    | grep -v -i warn | tee "$OUT/part_box_probe.log"
  kg bare 256x160x64 3; sanitize /tmp/part.kg "bare 256x160 s3"
  kg fused 256x160x64 3; sanitize /tmp/part.kg "fused 256x160 s3" ;;
narrow)
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_hopper_gpu.py \
    tests/gpu/test_staged_input_gpu.py tests/gpu/test_any_shape_gpu.py -k "x152 or kgen_load" 2>&1 \
    | tail -8 | tee "$OUT/pytest_narrow.log"
  timeout 300 python3 bench/prototypes/part_box_probe.py --part narrow 2>&1 | grep -v -i warn \
    | tee "$OUT/part_box_narrow.log"
  kg bare 256x152x64 4; sanitize /tmp/part.kg "bare 256x152 s4"
  kg fused 256x152x64 4; sanitize /tmp/part.kg "fused 256x152 s4" ;;
final)
  timeout 170 python3 bench/prototypes/part_box_probe.py --part rule152 2>&1 | grep -v -i warn \
    | tee "$OUT/part_box_rule152.log"
  timeout 150 python3 bench/defaults.py --part 3 --json "$OUT/sweep.json" 2>&1 \
    | grep -v -i warn | tee "$OUT/sweep.log"
  timeout 230 python3 -m pytest -v -m gpu -p no:cacheprovider -n 14 tests/gpu \
    --ignore=tests/gpu/test_tune_gpu.py > "$OUT/pytest_gpu_xdist.log" 2>&1
  echo "pytest exit $?"; grep -E "FAILED|ERROR" "$OUT/pytest_gpu_xdist.log" | head -20
  grep -c PASSED "$OUT/pytest_gpu_xdist.log"; tail -3 "$OUT/pytest_gpu_xdist.log"
  gzip -f "$OUT/pytest_gpu_xdist.log" ;;
rule)
  timeout 260 python3 bench/prototypes/part_box_probe.py --part rule 2>&1 | grep -v -i warn \
    | tee "$OUT/part_box_rule.log"
  timeout 300 python3 -m pytest -v -m gpu -p no:cacheprovider -n 14 tests/gpu \
    --ignore=tests/gpu/test_tune_gpu.py > "$OUT/pytest_gpu_xdist.log" 2>&1
  echo "pytest exit $?"; grep -E "FAILED|ERROR" "$OUT/pytest_gpu_xdist.log" | head -20
  grep -c PASSED "$OUT/pytest_gpu_xdist.log"; tail -3 "$OUT/pytest_gpu_xdist.log"
  gzip -f "$OUT/pytest_gpu_xdist.log"
  timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_tune_gpu.py 2>&1 \
    | tail -4 | tee "$OUT/pytest_gpu_tune.log"
  timeout 240 python3 bench/defaults.py --part 3 --json "$OUT/sweep.json" 2>&1 \
    | grep -v -i warn | tee "$OUT/sweep.log" ;;
esac
