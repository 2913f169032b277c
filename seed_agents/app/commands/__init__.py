"""The CLI's commands beyond ``eval`` and ``train``, one module each; ``seed_agents.app.cli``
registers them. Each parses its flags into its config, then calls the library."""
