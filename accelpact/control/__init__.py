"""Out-of-band control plane (Gloo group + compare-and-set outcome register)."""

from .plane import ControlPlane, ControlPlaneError

__all__ = ["ControlPlane", "ControlPlaneError"]
