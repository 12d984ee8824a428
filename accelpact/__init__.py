"""AccelPact: keep sharded PyTorch training alive through communication failures, in memory."""

__version__ = "0.1.0"
