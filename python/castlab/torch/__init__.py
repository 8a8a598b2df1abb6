"""castlab.torch: capture a PyTorch model into castlab (placeholder docstring)."""

from ._drift import ModelDrift, drift
from ._program import CaptureError, CapturedModel, Segment, capture

__all__ = ["capture", "CapturedModel", "CaptureError", "Segment", "drift", "ModelDrift"]
