"""specops: speculative decoding as a self-tuning Kubernetes service."""

__version__ = "0.1.0"
