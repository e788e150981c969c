"""``python -m kprod_broker``: the ``kprod-broker`` command."""

import sys

from kprod_broker.cli import main

sys.exit(main())
