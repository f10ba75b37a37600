"""Data in: P.L. 94-171 and Parquet ingest, validation, tabulation, the invariants (statistics of the input held
exact) and the constraint right-hand sides they give, demo and synthetic inputs."""

#: How ``ingest blocks`` gives the collapsed groups (two or more races, Hispanic) their race combinations
#: (ingest module docstring); here so that the command line offers them without importing the ingest.
RACE_CHOICES = ("spread", "compact")
