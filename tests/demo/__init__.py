"""The local demo (`make demo`): the real operator tuning simulated Triton pods, watched by real Prometheus.

Run it with ``python -m tests.demo [--fast] [--workdir DIR]``; see ``tests/demo/__main__.py``.
"""
