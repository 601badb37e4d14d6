"""What tests and benchmarks share (neither imports the other): the shared
helpers and jobs, and the benchmarks' harness (`bench.py`: arguments, step
timing, result rows; `memory.py`: peak memory)."""
