"""Benchmarks (not part of the test suite): see bench/README.md."""
