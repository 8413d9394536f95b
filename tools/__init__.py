"""What serves the framework without being it: the benchmarks' logic, the GPU check, mutation
testing, the runs' comparison plot. It may import repro, train, foam and models; only scripts/
and tests/ import it, so the library, the trainer and the reproduction never depend on a tool."""
