"""``python -m hpcml``: the same entry point as the ``hpcml`` script."""

import sys

try:                        # Ctrl-C while the entry point itself is imported: one line too
    from hpcml.cli import main
except KeyboardInterrupt:
    print("hpcml: interrupted", file=sys.stderr)
    raise SystemExit(130) from None

if __name__ == "__main__":
    main()
