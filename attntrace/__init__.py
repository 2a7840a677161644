"""attntrace: capture and lint PyTorch profiler traces of attention."""

__version__ = "0.1.0"
