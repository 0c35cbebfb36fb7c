"""`python -m exporters` is `edge-export`."""

import sys

from exporters.cli import main

sys.exit(main())
