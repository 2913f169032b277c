"""The TextWorld suite's offline analyzer: skills written by rules from the episode's data.

The deterministic stand-in for a stronger analyzer where no endpoint is reachable (tests,
CI, air-gapped demos, automatic stage 1): ``TextWorldSuite.offline_analyzer()``. It reads
the structured turns the env agent records (``seed_agents.envs.EpisodeRecord``: each
command sent, the admissible commands shown, the env's verdict and reward), never the
prompt text and never hidden game data such as the walkthrough. The objective is the
first paragraph of the first observation, where ``TextWorldEnv.reset`` puts it.

Success -> a workflow (the commands that worked, in order); failure -> corrective rules
(the listed command that matches the objective's nouns but was never tried, the answer
format after invalid commands, no repeats, no idle looking), which never quote the
failed commands. The reply is the JSON ``seed_agents.skills.parse_skill`` accepts.
"""

from __future__ import annotations

import re
from collections import Counter

from seed_agents.skills import (
    CONTROL_MARKERS,
    WORD_BUDGET,
    RuleBasedAnalyzer,
    count_of,
    fit_words,
)
from seed_agents.types import EpisodeRecord

INFO_VERBS = ("look", "examine", "inventory", "l", "x", "i")
_SUGGEST_VERBS = {"take": 0, "unlock": 1, "open": 2, "insert": 3, "put": 3, "eat": 4, "drink": 4, "cook": 4, "go": 5}
_GOAL_VERBS = frozenset(
    "take lift pick pick-up grab get recover retrieve find fetch collect bring put place insert drop open unlock "
    "close go venture travel head move walk trip enter leave eat drink cook make prepare reach climb".split()
)
_STOPWORDS = frozenset(
    "a an the to of in on into onto from with at by for and or then it its this that you your is are be "
    "up out off over under inside floor room".split()
)
_FILLER = re.compile(
    r"^(?:okay|ok|alright|and|then|so|now|next|please|finally|lastly|after that|first(?: of all| step| off| thing)?|"
    r"once (?:that's|you've|you have)[^,]*|here is[^,]*|your (?:\w+ )?(?:task|objective|goal|mission)(?: for today)? is to|"
    r"(?:you )?(?:have|need|want|are going) to|you must|you should|try to|attempt to|make sure (?:that )?you|"
    r"why not|can you|could you|be sure to)\b[,:]?\s*",
    re.IGNORECASE,
)


class TextWorldAnalyzer(RuleBasedAnalyzer):
    """Offline, deterministic skills for TextWorld episodes (see the module docstring)."""

    name = "rule-based-textworld"
    fallback_skill = "Each turn, copy exactly one command from the numbered list that moves you toward the objective."

    def summarize(self, episode: EpisodeRecord) -> tuple[str, str]:
        ep = _read_episode(episode)
        return _workflow(ep) if episode.success else _avoidance(ep)


class _Turn:
    def __init__(self, listed: list[str], command: str, valid: bool, scored: bool) -> None:
        self.listed, self.command, self.valid, self.scored = listed, command, valid, scored


class _Episode:
    def __init__(self, turns: list[_Turn], objective: str) -> None:
        self.turns, self.objective = turns, objective
        self.goal = _goal(objective)


def _read_episode(episode: EpisodeRecord) -> _Episode:
    """The turns as the rules need them: a command counts as valid when the env took it;
    a positive reward (TextWorld's score going up) marks progress."""
    turns = [_Turn(list(s.admissible_actions), s.action.strip(), not s.invalid and bool(s.action.strip()), s.reward > 0)
             for s in episode.steps]
    first = episode.first_observation or episode.steps[0].observation
    objective = re.split(r"\n\s*\n", first.strip(), maxsplit=1)[0].strip() if first.strip() else ""
    return _Episode(turns, objective)


def _goal(objective: str) -> str:
    """The objective's imperative parts, filler stripped: 'travel north, then lift the passkey ...'."""
    parts = []
    for sentence in re.split(r"(?<=[.!?])\s+", objective.replace("\n", " ")):
        if "textworld" in sentence.lower() or sentence.rstrip().endswith("?"):
            continue
        s = sentence.strip().rstrip(".!").strip()
        for _ in range(8):
            stripped = _FILLER.sub("", s, count=1).strip()
            if stripped == s:
                break
            s = stripped
        words = re.findall(r"[a-z][a-z-]*", s.lower())
        if words and (words[0] in _GOAL_VERBS or (len(words) > 1 and words[0] == "to" and words[1] in _GOAL_VERBS)):
            parts.append(s[0].lower() + s[1:])
    goal = ", then ".join(parts)
    if not goal or len(goal.split()) > 30:
        goal = parts[-1] if parts else objective.strip().split("\n")[0]
    words = goal.split()
    return " ".join(words[:30]).rstrip(",;:") if words else "complete the task"


def _quote(command: str, limit: int = 40) -> str:
    """A command safe to quote inside a skill: one line, no control tokens, clipped."""
    text = " ".join(command.split())
    for marker in CONTROL_MARKERS:
        text = text.replace(marker, " ")
    text = " ".join(text.replace("'", "").replace("<", " ").replace(">", " ").split())
    text = text if len(text) <= limit else text[: limit - 3].rstrip() + "..."
    return f"'{text}'" if text else "an empty reply"


def _workflow(ep: _Episode) -> tuple[str, str]:
    valid = [t.command for t in ep.turns if t.valid]
    plan = [c for c in valid if c.split()[0].lower() not in INFO_VERBS] or valid
    plan = [c for i, c in enumerate(plan) if i == 0 or c.lower() != plan[i - 1].lower()]  # collapse repeats
    n_invalid = sum(not t.valid for t in ep.turns)
    if len(plan) > 8:
        plan = plan[-8:]  # the end of a long run is what won it
        order = "..., then " + ", then ".join(_quote(c) for c in plan)
    else:
        order = ", then ".join(_quote(c) for c in plan) or "the listed commands"
    first = f"To {ep.goal}, use {order}."
    rule = "Copy each command exactly from the numbered list" + (
        " and never type a command that is not listed." if n_invalid else ", one per turn.")
    skill = fit_words([first, rule])
    if len(skill.split()) > WORD_BUDGET:  # a very long goal: drop it, keep the order
        skill = fit_words([f"Use {order}.", rule])
    # short: the skill is what gets injected, and a policy that learns to write long
    # summaries runs out of its analyzer budget before the skill
    summary = (f"The agent succeeded in {count_of(len(ep.turns), 'step')}"
               + (f" with {n_invalid} invalid command{'s' * (n_invalid != 1)}" if n_invalid else "") + ".")
    return summary, skill


def _avoidance(ep: _Episode) -> tuple[str, str]:
    """Rules for a failed episode, phrased as what to do next time.

    A failed command is never quoted: measured with ``skills eval``, a 135M policy takes
    a quoted bad command as a cue and the skill then made the failed actions *more*
    likely. So each rule names the fix (the listed command the objective points at, the
    format to answer in, the habit to drop) and only successful commands are quoted.
    """
    turns = ep.turns
    rules: list[str] = []
    suggestion = _suggestion(ep)
    if suggestion:
        rules.append(suggestion)
    n_invalid = sum(not t.valid for t in turns)
    if n_invalid:
        rules.append("Answer with exactly one command copied from the numbered list, nothing else: "
                     "no description, no number, no extra words.")
    counts = Counter(t.command.lower() for t in turns if t.valid and not t.scored)
    repeated = [c for c, n in counts.items() if n >= 2]
    if repeated:
        rules.append("Never send the same command twice in a row; when a command gave no progress, "
                     "pick a listed command you have not tried yet.")
    info = [t for t in turns if t.valid and t.command.split()[0].lower() in INFO_VERBS]
    if info and len(rules) < 3:
        rules.append("Act on the objective from the first turn instead of looking around or examining things.")
    scored = [t.command for t in turns if t.scored]
    if scored and len(rules) < 3:
        rules.append(f"{_quote(scored[0])} made progress, so do it early and then continue toward the objective.")
    if not rules:
        rules.append(f"Do not stop short: each turn, choose the listed command that moves toward the objective ({ep.goal}).")
    skill = fit_words(rules[:3])
    facts = [f"{n_invalid} invalid command{'s' * (n_invalid != 1)}"] if n_invalid else []
    if repeated:
        facts.append("repeated commands without progress")
    if scored:
        facts.append("made some progress")
    summary = f"The agent failed in {count_of(len(turns), 'step')}" + (": " + ", ".join(facts) if facts else "") + "."
    return summary, skill


def _suggestion(ep: _Episode) -> str | None:
    """A listed command whose objects the objective names, that the agent never tried."""
    nouns = [w for w in re.findall(r"[a-z][a-z-]*", ep.goal.lower()) if w not in _STOPWORDS and w not in _GOAL_VERBS]
    if not nouns:
        return None
    tried = {t.command.lower() for t in ep.turns}
    best: tuple[tuple[int, int, int], str, str] | None = None
    seen: list[str] = list(dict.fromkeys(c for t in reversed(ep.turns) for c in t.listed))  # newest lists first
    for rank, command in enumerate(seen):
        words = command.lower().split()
        if not words or words[0] not in _SUGGEST_VERBS or command.lower() in tried:
            continue
        hits = [n for n in nouns if n in words[1:]]
        if not hits:
            continue
        key = (-len(hits), _SUGGEST_VERBS[words[0]], rank)
        if best is None or key < best[0]:
            best = (key, command, hits[0])
    if best is None:
        return None
    return f"The objective mentions {best[2]}: send {_quote(best[1])} as soon as it is listed."
