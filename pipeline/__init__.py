"""census-topdown pipeline: configuration, data contracts, measurement, estimation on Dask, outputs."""
