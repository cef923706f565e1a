"""loopguard: a transparent reverse proxy that detects and breaks AI agents' tool-call loops."""

__version__ = "0.1.0"
