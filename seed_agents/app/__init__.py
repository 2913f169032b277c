"""The app layer: the ``seed-agents`` CLI and what it wires together.

It is the one place that joins the core (``seed_agents.*``) with the graphs, tools and
trainers (``seed_agents.graphs``, ``seed_agents.tools``, ``seed_agents.trainers``), and it
imports them at the top of its modules. Nothing in the core imports this package
(``tests/unit/test_layering.py`` checks it).

- ``cli``: the root parser, one-line user errors; ``flags``: each command's flags generated
  from its pydantic config; ``commands/``: the commands beyond eval and train;
- ``builders``: a backend and its chat model, the agent's options, tasks (every command);
- ``policy``: the trainable policy, its weight sync and TRL's arguments (train, continual);
- ``train``: the reference training loop (``seed-agents train``);
- ``continual``, ``continual_config``, ``serving``: the continual loop, its typed config, and
  where its versions are sampled from.
"""
