"""The ALFWorld suite's offline analyzer: skills written by rules from the episode's data.

``AlfWorldSuite.offline_analyzer()``: the deterministic stand-in for a stronger analyzer
(tests, CI, automatic stage 1). It reads only structured data: the goal
(``info["objective"]``, "Your task is to: put a clean mug in coffeemachine."), the task
type (``info["game_type"]``: pick, look, clean, heat, cool, pick2) and each turn's
admissible commands, command sent and verdict (``seed_agents.envs.EpisodeRecord``).

Skills name object and place *kinds* ("mug", "countertop"), not ALFWorld's instance
numbers ("mug 1"), so they carry over to other games of the same task type:
- won: the workflow: where the object was found, the manipulations in order
  ("take the mug from the countertop, clean it with the sinkbasin, move it to the
  coffeemachine");
- lost: corrective rules: the task type's required step that never happened (clean with
  the sinkbasin, heat with the microwave, cool with the fridge, use the desklamp), the
  object the goal names that was offered but never taken, the answer format after
  invalid commands, no repeated commands; failed commands are never quoted.
"""

from __future__ import annotations

import re
from collections import Counter

from seed_agents.skills import RuleBasedAnalyzer, count_of, fit_words
from seed_agents.types import EnvStep, EpisodeRecord

TASK_ANCHOR = "your task is to:"
# The step each task type needs besides taking and placing: (command verb, what to say).
REQUIRED_STEP = {
    "clean": ("clean", "clean it with the sinkbasin"),
    "heat": ("heat", "heat it with the microwave"),
    "cool": ("cool", "cool it with the fridge"),
    "look": ("use", "turn on the desklamp (use it) while holding the object"),
}
INFO_VERBS = frozenset({"look", "inventory", "examine", "help"})
_ARTICLES = frozenset({"a", "an", "some", "two", "the", "clean", "hot", "cool", "cold", "heated", "cooled"})


def kind(name: str) -> str:
    """'mug 1' -> 'mug': the object or place kind, without ALFWorld's instance number."""
    return re.sub(r"\s+\d+\b", "", name).strip()


def generalize(command: str) -> str:
    """A command with instance numbers dropped: 'take mug 1 from countertop 2' -> 'take mug from countertop'."""
    return " ".join(kind(command).split())


def goal_of(episode: EpisodeRecord) -> str:
    """The goal sentence without the "Your task is to:" anchor, e.g. 'put a clean mug in coffeemachine'."""
    objective = str(episode.metadata.get("objective") or "")
    if not objective:  # the anchor line of the first observation (AlfWorldEnv puts it there too)
        first = episode.first_observation or (episode.steps[0].observation if episode.steps else "")
        objective = next((ln for ln in first.splitlines() if ln.strip().lower().startswith(TASK_ANCHOR)), "")
    text = objective.strip()
    if text.lower().startswith(TASK_ANCHOR):
        text = text[len(TASK_ANCHOR):]
    return text.strip().rstrip(".").strip() or "complete the task"


def goal_objects(goal: str, steps: list[EnvStep]) -> list[str]:
    """Object kinds the goal names that some 'take X from Y' command offered: the things to fetch."""
    words = [w for w in re.findall(r"[a-z]+", goal.lower()) if w not in _ARTICLES]
    offered = {kind(m.group(1)) for s in steps for c in s.admissible_actions
               if (m := re.match(r"take (.+?) from ", c))}
    return [w for w in dict.fromkeys(words) if w in offered]


def _quote(command: str) -> str:
    return "'" + command.replace("'", "") + "'"


class AlfWorldAnalyzer(RuleBasedAnalyzer):
    """Offline, deterministic skills for ALFWorld episodes (see the module docstring)."""

    name = "rule-based-alfworld"
    fallback_skill = "Each turn, copy exactly one command from the admissible list that moves you toward the goal."

    def summarize(self, episode: EpisodeRecord) -> tuple[str, str]:
        return _workflow(episode) if episode.success else _avoidance(episode)


def _done(episode: EpisodeRecord) -> list[str]:
    """The commands the game took, in order."""
    return [s.action for s in episode.steps if not s.invalid and s.action.strip()]


def _workflow(episode: EpisodeRecord) -> tuple[str, str]:
    goal = goal_of(episode)
    acts = [generalize(c) for c in _done(episode) if c.split()[0] not in INFO_VERBS]
    # the manipulations, each with the place it happened at; walking is implied by "at the ..."
    plan: list[str] = []
    place = ""
    for c in acts:
        if c.startswith("go to "):
            place = c[len("go to "):]
            continue
        step = c
        if place and place not in c and not re.search(r"\b(from|to|with|in|on)\b", c):
            step = f"{c} at the {place}"
        if not plan or plan[-1] != step:
            plan.append(step)
    if len(plan) > 8:
        plan = plan[-8:]  # the end of a long run is what won it
    order = ", then ".join(_quote(p) for p in plan) or "the listed commands"
    n_invalid = sum(s.invalid for s in episode.steps)
    rule = "Go to each place before acting there and copy each command exactly from the admissible list" + (
        "; never type a command that is not listed." if n_invalid else ".")
    skill = fit_words([f"To {goal}: {order}.", rule])
    summary = (f"The agent succeeded in {count_of(len(episode.steps), 'step')}"
               + (f" with {n_invalid} invalid command{'s' * (n_invalid != 1)}" if n_invalid else "") + ".")
    return summary, skill


def _avoidance(episode: EpisodeRecord) -> tuple[str, str]:
    """Rules phrased as what to do next time; a failed command is never quoted (a small
    policy takes a quoted command as a cue, as measured on TextWorld)."""
    goal, steps = goal_of(episode), episode.steps
    done = [generalize(c) for c in _done(episode)]
    rules: list[str] = []
    objects = goal_objects(goal, steps)
    taken = {w for c in done if c.startswith("take ") for w in c.split()[1:2]}
    missing = [o for o in objects if o not in taken]
    if missing:
        rules.append(f"The goal needs the {missing[0]}: go to the places where a {missing[0]} may be and take it "
                     f"as soon as a 'take {missing[0]} ... from ...' command is listed.")
    required = REQUIRED_STEP.get(str(episode.metadata.get("game_type") or ""))
    if required is not None and not any(c.split()[0] == required[0] for c in done):
        rules.append(f"After taking the object, {required[1]} before finishing the task.")
    n_invalid = sum(s.invalid for s in steps)
    if n_invalid:
        rules.append("Answer with exactly one command copied from the admissible list, nothing else.")
    counts = Counter(c for c in done if not c.startswith("go to "))
    if any(n >= 2 for n in counts.values()) and len(rules) < 3:
        rules.append("Never repeat a command that changed nothing; go to a place you have not checked yet.")
    if not rules:
        rules.append(f"Do not wander: plan the steps to {goal} and take one toward it every turn.")
    skill = fit_words(rules[:3])
    facts = [f"{n_invalid} invalid command{'s' * (n_invalid != 1)}"] if n_invalid else []
    if missing:
        facts.append(f"never took the {missing[0]}")
    summary = f"The agent failed to {goal} in {count_of(len(steps), 'step')}" + (": " + ", ".join(facts) if facts else "") + "."
    return summary, skill
