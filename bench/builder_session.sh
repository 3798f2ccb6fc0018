#!/usr/bin/env bash
# One visit for issue 17's builder: its GPU tests, then parts of bench/defaults.py. Run
#   bash .gpu/device-run.sh bash bench/builder_session.sh
# PARTS="1 3" picks the bench parts (default: 2); SKIP_PYTEST=1 leaves the tests out.
# Logs go to $OUT (or ./out).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 KGEN_CACHE_DIR=/tmp/kgen-cache
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
if [ -z "${SKIP_PYTEST:-}" ]; then
  echo "== pytest: the builder's choices"
  timeout 300 python3 -m pytest tests/gpu/test_builder_gpu.py -m gpu -q -p no:cacheprovider 2>&1 \
    | tail -25 | tee "$OUT/pytest_builder.log"
fi
PARTS=${PARTS:-2}
tag=$(echo $PARTS | tr ' ' '_')
echo "== bench/defaults.py --part $PARTS"
timeout 480 python3 bench/defaults.py --part $PARTS --json "$OUT/defaults_$tag.json" 2>&1 \
  | tee "$OUT/defaults_$tag.log"
