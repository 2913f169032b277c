"""Stage 1 of SEED: make the policy a competent hindsight analyzer before RL.

- ``analyzers``: who writes the skills (an OpenAI-compatible endpoint, any LangChain chat
  model, the served policy, or an env suite's offline analyzer, e.g. TextWorld's rule-based one);
- ``collect``: roll out the base policy, analyze each episode, keep what parses
  (``seed-agents skills collect``, resumable);
- ``sft``: TRL ``SFTTrainer`` on analyzer prompt -> skill JSON (``seed-agents skills sft``);
- ``usefulness``: does a skill move the policy toward better actions
  (``seed-agents skills eval``).

Records between the steps are ``seed_agents.types.SkillExample`` lines in JSONL files.
"""
