"""Kopf handlers: the only package that imports kopf. Importing it registers them.

Run with `specops run` (or `kopf run -m specops.handlers`).
"""

from specops.handlers import control as control
from specops.handlers import lifecycle as lifecycle

__all__ = ["control", "lifecycle"]
