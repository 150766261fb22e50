"""One module per recording format the scorer imports. Each returns a ``Recording``."""
