"""``python -m seed_agents.gateway --upstream URL --model NAME ...`` is ``seed-agents gateway ...``.

An entry point, so it belongs to the app layer like ``seed_agents.__main__``: the command
line lives in ``seed_agents.app.commands.gateway``.
"""

import sys

from seed_agents.app.cli import main

sys.exit(main(["gateway", *sys.argv[1:]]))
