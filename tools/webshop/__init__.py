"""WebShop (Yao et al., 2022) as an env suite: shop on a simulated site for a written
instruction, with ``search[query]`` and ``click[button]``, scored when the agent buys.

Modules, each readable alone:
- ``catalog``: products, goals and splits from the original data files;
  ``WebShopDataError`` when they are missing.
- ``synthetic``: a small generated catalog, the offline default (ids say "synthetic").
- ``search``: a pure-Python BM25 index standing in for the original's Lucene.
- ``reward``: the original purchase reward (type x matched attributes, options, price).
- ``env``: the pages and the text protocol (``WebShopEnv``).
- ``remote``: the same protocol against a running original WebShop server over HTTP.
- ``suite``: ``WebShopSuite``, registered as the ``webshop`` entry point.

Score, as papers report it, is mean reward x 100; success is reward 1. The per-step
reward is 0 until Buy Now, so a trajectory's reward is its final score and
``summarize``'s ``mean_reward`` x 100 is the score.
"""

from seed_agents.tools.webshop.catalog import (
           Catalog,
           Goal,
           Product,
           WebShopDataError,
           load_webshop,
)
from seed_agents.tools.webshop.env import WebShopEnv
from seed_agents.tools.webshop.reward import get_reward
from seed_agents.tools.webshop.suite import WebShopSuite
from seed_agents.tools.webshop.synthetic import synthetic_catalog

__all__ = ["Catalog", "Goal", "Product", "WebShopDataError", "WebShopEnv", "WebShopSuite", "get_reward",
           "load_webshop", "synthetic_catalog"]
