"""The run: levels and invariants, chunked per-parent tasks on Dask, the run directory, resume, batches, reprocessing and the noisy measurement file."""
