"""The GPU machine's benchmarks and tools (``bench/gpu/run.sh`` builds the CUDA engine there and runs them)."""
