"""modelgate: a pluggable reverse proxy for model APIs."""

__version__ = "0.1.0"
