"""Environment suites, each registered under the ``seed_agents.envs`` entry-point group:
``textworld`` (generated games, the offline default), ``alfworld`` (the ALFWorld text
benchmark, real engine) and ``webshop`` (the WebShop protocol and reward, pure Python)."""
