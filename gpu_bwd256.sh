#!/usr/bin/env bash
# (scratch, not committed) bwd256's second GPU visit: the split schedule (dP^T ahead, dV and dK after dQ)
set -uo pipefail
OUT=${OUT:-out}; mkdir -p $OUT
export PYTHONUNBUFFERED=1 KGEN_CACHE_DIR=/tmp/kc
echo "== gpu tests"
timeout 45 python3 -m pytest -q -rfE -m gpu -p no:cacheprovider -n 14 tests/gpu/test_attention_bwd_d256_gpu.py -k "not mods" > $OUT/pytest.log 2>&1
echo "exit $?"; grep -E "^(FAILED|ERROR)" $OUT/pytest.log | head -20; tail -1 $OUT/pytest.log
echo "== racecheck"
timeout 30 compute-sanitizer --tool racecheck --error-exitcode 9 python3 bench/attention_bwd.py --once --d 256 > $OUT/race.log 2>&1
echo "exit=$? $(grep -E 'ran;|RACECHECK SUMMARY' $OUT/race.log | tr '\n' ' ')"
echo "== bench"
timeout 30 python3 bench/attention_bwd.py --d 256 --s 4096 > $OUT/bwd.log 2>&1; echo "exit $?"; grep -v "^#" $OUT/bwd.log
