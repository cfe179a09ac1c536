"""What tests, the demo and the benchmarks share: starting a daemon, and the built-in workloads."""
