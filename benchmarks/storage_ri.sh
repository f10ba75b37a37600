#!/usr/bin/env bash
# Rhode Island 2010 (both products, 2 workers) to and from a local S3-compatible server (moto) against local
# disk, alternated twice in one sitting: each run's wall and CPU (/usr/bin/time: elapsed, user, sys, peak RSS),
# the store's requests by method, the manifests' per-stage timings and whether the outputs are the same bytes.
# Needs `pip install 'census-topdown[s3]' 'moto[server]'`. Usage: bash benchmarks/storage_ri.sh WORKDIR [PORT]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${1:?usage: storage_ri.sh WORKDIR [PORT]}; port=${2:-5961}
mkdir -p "$work" && cd "$work"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 RAYON_NUM_THREADS=1
export AWS_ENDPOINT_URL=http://127.0.0.1:$port AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench AWS_DEFAULT_REGION=us-east-1
rm -rf local-in run-local* manifests moto.log && mkdir manifests
moto_server -H 127.0.0.1 -p "$port" 2> moto.log &
moto=$!
trap 'kill $moto 2>/dev/null || true' EXIT
sleep 3
python -c "import boto3; boto3.client('s3').create_bucket(Bucket='bkt')"
topdown ingest blocks "$repo/data/ri2010/ri_2010_block_demographics.csv.gz" --out local-in > /dev/null
python -c "import s3fs; s3fs.S3FileSystem().put('local-in', 'bkt/ri-in', recursive=True)"   # ingest writes locally
for i in 1 2; do
  echo "local $i: load $(cut -d' ' -f1-3 /proc/loadavg)"
  /usr/bin/time -f "  wall %e s, user %U s, sys %S s, peak %M kB" \
    topdown run "$repo/conf/ri2010.toml" --input local-in --out "run-local$i" --workers 2 --quiet
  cp "run-local$i/manifest.json" "manifests/local$i.json"
  n0=$(wc -l < moto.log)
  echo "s3 $i: load $(cut -d' ' -f1-3 /proc/loadavg)"
  /usr/bin/time -f "  wall %e s, user %U s, sys %S s, peak %M kB" \
    topdown run "$repo/conf/ri2010.toml" --input s3://bkt/ri-in --out "s3://bkt/run-s3$i" --workers 2 --quiet
  python -c "import s3fs; s3fs.S3FileSystem().get('bkt/run-s3$i/manifest.json', 'manifests/s3$i.json')"
  echo "  requests: $(tail -n +$((n0 + 1)) moto.log | grep -oE '"(GET|HEAD|PUT|POST|DELETE) ' | sort | uniq -c | tr -s ' \n' ' ')"
done
echo "end: load $(cut -d' ' -f1-3 /proc/loadavg); the store's CPU: $(ps -o cputime= -p $moto)"
python - <<'PY'
import json
for i in (1, 2):
    loc, s3 = (json.load(open(f"manifests/{k}{i}.json")) for k in ("local", "s3"))
    differ = sorted(k for k in loc["output_sha256"] if loc["output_sha256"][k] != s3["output_sha256"].get(k))
    print(f"pair {i}: outputs that differ: {differ} (config.json records the input's location)")
    for stage in loc["timings"]:
        print(f"  {stage:22s} {loc['timings'][stage]:8.2f} {s3['timings'].get(stage, float('nan')):8.2f}")
PY
