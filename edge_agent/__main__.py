"""`python -m edge_agent` is `edge-agent`."""

import sys

from edge_agent.cli import main

sys.exit(main())
