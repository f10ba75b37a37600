"""Data in: P.L. 94-171 and Parquet ingest, validation, tabulation, demo and synthetic inputs."""
