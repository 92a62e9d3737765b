"""Benchmark scripts (routing op, training throughput); outputs under results/bench/."""
