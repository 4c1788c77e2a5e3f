"""decode-gap: explain the gap between an LLM server's decode latency and its roofline."""

__version__ = "0.1.0"
