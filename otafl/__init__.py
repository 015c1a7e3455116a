"""otafl: over-the-air federated learning privacy simulator."""

__version__ = "0.1.0"
