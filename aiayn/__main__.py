"""``python -m aiayn``: the same as the ``aiayn`` command (``aiayn.cli``)."""

import sys

from aiayn.cli import main

sys.exit(main())
