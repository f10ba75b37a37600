#!/usr/bin/env bash
# Every Rhode Island 2010 parent, every level, on both paths (benchmarks/RESULTS_pyomo.md): capture the run's
# parent problems once, compare them in N processes side by side (default: one per CPU), merge the figures.
# Usage: benchmarks/pyomo_ri_all.sh [WORKDIR (default /tmp/ri)] [N]   (PYTHON=python3 to choose the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-/tmp/ri}
n=${2:-$(nproc)}
py=${PYTHON:-python}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
if [ ! -f "$work/input/persons.parquet" ]; then
    "$py" -m topdown.pipeline.cli ingest blocks data/ri2010/ri_2010_block_demographics.csv.gz --out "$work/input"
fi
if [ ! -f "$work/problems.pkl" ]; then
    start=$SECONDS
    "$py" benchmarks/pyomo_path.py capture conf/ri2010.toml --input "$work/input" --out "$work" 2> "$work/capture.err" \
        || { tail -20 "$work/capture.err" >&2; exit 1; }
    echo "captured in $((SECONDS - start)) s" >&2
fi
start=$SECONDS
for k in $(seq 0 $((n - 1))); do
    "$py" benchmarks/pyomo_path.py compare "$work" --solver appsi_highs --qp-solver highs --shard "$k/$n" \
        > "$work/shard-$k.jsonl" 2> "$work/shard-$k.err" &
done
wait
echo "compared in $((SECONDS - start)) s on $n processes" >&2
"$py" benchmarks/pyomo_path.py merge "$work"/shard-*.jsonl
