#!/usr/bin/env bash
# Part boxes on ping-pong (issue 17): the GPU tests of the tiles whose N is not a multiple of 64
# (ping-pong 128x96 and 64x160 beside the cooperative 128x96, 256x160 and 256x152, whose
# staging's last n8 group text changed after the last GPU run), then compute-sanitizer on
# ping-pong 128x96 s5 at ragged sizes, bare and fused (C through the staging).
# Run: bash .gpu/device-run.sh bash bench/prototypes/pingpong_part_session.sh
. "$(dirname "$0")/../session_head.sh"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/device.log"
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/gpu/test_hopper_gpu.py \
  tests/gpu/test_staged_input_gpu.py -k "x96 or x160 or x152" 2>&1 | tail -6 | tee "$OUT/pytest_part.log"
kg() {  # the bare (or fused) kernel on ping-pong, tile $2, stages $3
  python3 -c "import sys; sys.path[:0] = ['bench', 'bench/prototypes']; from defaults import BARE; from misaligned_probe import FUSED; print(BARE.format(t='f16') if '$1' == 'bare' else FUSED)" \
    | sed "s/accumulate f32 {/accumulate f32 {\n    tile $2\n    warps 2x4\n    stages $3/; s/target sm_90a/target sm_90a\n  schedule pingpong/" > /tmp/part.kg
}
kg bare 128x96x64 5; grep -c pingpong /tmp/part.kg; sanitize /tmp/part.kg "bare pingpong 128x96 s5"
kg fused 128x96x64 5; sanitize /tmp/part.kg "fused pingpong 128x96 s5"
