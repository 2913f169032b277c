"""TRL-based training for seed-agents: ``seed_trainer`` (SEEDTrainer, SEEDConfig),
``rollout`` (GraphRollout: LangGraph episodes -> rows + teacher prompts) and
``weight_sync`` (full, LoRA and in-process hot reload)."""
