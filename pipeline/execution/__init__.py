"""The run: levels, chunked per-parent tasks on Dask, resume, batches, reprocessing and the noisy measurement file; jobs started without blocking."""
