"""pgqueue benchmark suite: ``python -m benchmarks --help``."""
