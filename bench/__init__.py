"""Benchmarks of the platform against baselines measured in the same run (``make bench``)."""
