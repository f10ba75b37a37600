"""Run-time services every command uses: storage (local paths and fsspec URLs, Parquet), the run directory and
its reader, output directories claimed by one rule, private files, progress bars and cancellation."""
