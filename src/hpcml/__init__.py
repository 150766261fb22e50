"""hpcml: make machine-learning training on HPC clusters healthy, fast and debuggable."""

__version__ = "0.1.0"


def version() -> str:
    """The installed distribution's version (what pip reports), else the source tree's."""
    from importlib import metadata
    try:
        return metadata.version("hpcml")
    except metadata.PackageNotFoundError:
        return __version__
