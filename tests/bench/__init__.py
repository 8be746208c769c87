"""Benchmarks that need the whole local stack (real Prometheus, the real operator, simulated pods)."""
