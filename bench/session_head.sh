# Sourced at the top of a GPU visit's script (bench/*_session.sh): strict pipes, the log folder
# $OUT (the device tool's, else ./out), unbuffered Python and a cubin cache of the visit's own.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 KGEN_CACHE_DIR=/tmp/kgen-cache
