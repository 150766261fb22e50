"""FAKE of DCGM's ``pydcgm`` module (it gathers the classes, as the real one does), for
tests: DCGM cannot exist on the machines the tests run on. See ../../README.md."""

from DcgmFieldGroup import *  # noqa: F401,F403
from DcgmGroup import *  # noqa: F401,F403
from DcgmHandle import *  # noqa: F401,F403
from DcgmSystem import *  # noqa: F401,F403


class DcgmException(Exception):
    pass
