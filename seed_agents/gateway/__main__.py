"""``python -m seed_agents.gateway --upstream URL --model NAME ...`` (same as ``seed-agents gateway``)."""

import sys

from seed_agents.gateway import main

sys.exit(main())
