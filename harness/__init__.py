"""What tests and benchmarks share (neither imports the other): the shared
helpers and jobs, and the benchmarks' harness (timing, memory, cluster launch,
result rows)."""
