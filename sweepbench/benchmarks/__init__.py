"""Benchmarks: each module registers one benchmark; ``conf/benchmark/<name>.yaml`` configures it."""

from sweepbench.benchmarks.base import Benchmark, BenchmarkResult
from sweepbench.benchmarks.registry import benchmark_names, get_benchmark, register

__all__ = ["Benchmark", "BenchmarkResult", "benchmark_names", "get_benchmark", "register"]
