"""Typed configs, one per concern, composed; every field documented (the descriptions are
the CLI help) and every YAML file under ``configs/`` validated by the same models.

- ``core``: backend, runner, agent and the paper's coefficients (``PAPER``): what the core
  needs, importing nothing above it;
- ``loading``: defaults < preset < YAML < flags, and one clear ``ConfigError``;
- ``commands``: the configs of ``eval`` and ``train``;
- ``presets``: named starting points (``--preset paper``: the paper's settings).
"""

from seed_agents.config.commands import (
    EvalConfig,
    GraphConfig,
    PeriodicEvalConfig,
    ReportTo,
    SkillConfig,
    Stage1Config,
    StoreSourceConfig,
    TrainConfig,
    TrainerConfig,
    agent_fields_given,
    with_suite_defaults,
)
from seed_agents.config.core import (
    AUTO_GUIDE_SHARE,
    PAPER,
    PAPER_LEARNING_RATE,
    AgentConfig,
    BackendConfig,
    RunnerConfig,
    SEEDCoefficients,
)
from seed_agents.config.loading import RenamedConfigKey, first_error, load_config, validation_message
from seed_agents.config.presets import PAPER_PRESET, PRESETS
from seed_agents.errors import ConfigError, UserError

__all__ = [
    "AUTO_GUIDE_SHARE", "PAPER", "PAPER_LEARNING_RATE", "PAPER_PRESET", "PRESETS", "AgentConfig", "BackendConfig",
    "ConfigError", "EvalConfig", "GraphConfig",
    "PeriodicEvalConfig", "RenamedConfigKey", "ReportTo", "RunnerConfig", "SEEDCoefficients", "SkillConfig",
    "Stage1Config", "StoreSourceConfig", "TrainConfig", "TrainerConfig", "UserError", "agent_fields_given",
    "first_error", "load_config", "validation_message", "with_suite_defaults",
]
