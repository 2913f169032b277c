"""``python -m seed_agents ...`` is the ``seed-agents`` command."""

import sys

from seed_agents.app.cli import main

sys.exit(main())
