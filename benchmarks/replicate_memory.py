"""Replicates of a run in-process: after each replicate, the scheduler's tasks, the keys in memory,
their copies and bytes, and each worker's RSS, to see whether a worker grows with the number of replicates.

    python benchmarks/replicate_memory.py RUN N OUT WORKERS
"""
import sys, collections
from topdown.pipeline.evaluation import replicates as R

orig = R._replicate
def wrapped(config, target, prep, client, cancel):
    out = orig(config, target, prep, client, cancel)
    def stats(dask_scheduler):
        mem = [ts for ts in dask_scheduler.tasks.values() if ts.state == "memory"]
        kinds = collections.Counter(ts.key[0] if isinstance(ts.key, tuple) else str(ts.key).split("-")[0] for ts in mem)
        reps = sum(len(ts.who_has) for ts in mem)
        return len(dask_scheduler.tasks), len(mem), reps, sum(ts.nbytes for ts in mem) / 2**20, kinds.most_common(6)
    import psutil
    rss = client.run(lambda: psutil.Process().memory_info().rss / 2**20)
    print(target.name, "scheduler:", client.run_on_scheduler(stats), "worker RSS:", {k[-5:]: round(v) for k, v in rss.items()}, flush=True)
    return out
R._replicate = wrapped

if __name__ == "__main__":
    run, n, out, workers = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    R.replicates(run, n, out, workers=workers)
