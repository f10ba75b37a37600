"""The run: preflight checks, levels, measurement sources, chunked per-parent tasks on Dask, resume, batches,
reprocessing and the noisy measurement file; jobs started without blocking."""
