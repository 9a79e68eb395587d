"""Measuring: the benchmark tool, the worker, local and Ray executors."""
