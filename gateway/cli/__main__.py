"""``python -m gateway.cli``: the ``serveproto`` command."""

import sys

from gateway.cli import main

sys.exit(main())
