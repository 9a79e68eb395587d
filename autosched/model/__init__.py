"""Models: lowering with IREE, dispatches and their roots, IREE's dispatch benchmarks."""
