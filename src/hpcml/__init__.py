"""hpcml: make machine-learning training on HPC clusters healthy, fast and debuggable."""

__version__ = "0.1.0"
