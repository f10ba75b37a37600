#!/bin/bash
# Coverage of the uncertainty intervals on Rhode Island 2010 with N replicates.
# usage: bash benchmarks/ri_coverage.sh N WORKERS PARALLEL   (outputs and timings in $OUT, scratch in $T)
# The tables hold coverage rates of true counts: keep them with the evaluation, not with published files.
set -u
N=$1; W=$2; P=$3
R=$(cd "$(dirname "$0")/.." && pwd); O=${OUT:-/tmp/ri_coverage}; T=${T:-/tmp/ri_coverage_work}
mkdir -p "$O"; rm -rf "$T"; mkdir -p "$T"
uptime | tee "$O/load.txt"
tm() { local name=$1; shift; /usr/bin/time -f "$name wall %e s user %U s sys %S s maxrss %M KB" -a -o "$O/times.txt" "$@"; }
tm ingest topdown ingest blocks "$R/data/ri2010/ri_2010_block_demographics.csv.gz" --out "$T/in" > /dev/null || exit 1
tm run topdown run "$R/conf/ri2010.toml" --out "$T/run" --input "$T/in" --workers "$W" --quiet || exit 1
tm replicates topdown replicates "$T/run" --n "$N" --out "$T/reps" --workers "$W" --parallel "$P" --quiet || exit 1
tm uncertainty topdown uncertainty "$T/run" --out "$T/unc.parquet" --replicates "$T/reps" --entities "$R/data/ri_baf2020" \
    --workers "$W" --quiet || exit 1
tm coverage python3 "$R/benchmarks/coverage.py" "$T/run" --truth "$T/in" --uncertainty "$T/unc.parquet" \
    --entities "$R/data/ri_baf2020" --json "$O/ri_cov.json" > "$O/ri_cov.md" || exit 1
tm coverage_units python3 "$R/benchmarks/coverage.py" "$T/run" --truth "$T/in" --uncertainty "$T/unc.parquet" \
    --product units --queries --entities "$R/data/ri_baf2020" > "$O/ri_cov_units.md" || exit 1
uptime | tee -a "$O/load.txt"
cat "$O/times.txt"
