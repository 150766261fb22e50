"""``python -m hpcml``: the same entry point as the ``hpcml`` script."""

from hpcml.cli import main

if __name__ == "__main__":
    main()
