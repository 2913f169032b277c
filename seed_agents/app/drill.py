"""`seed-agents continual drill`: rehearse the gate on the live setup with a candidate known to be worse.

A gate that has only ever passed copies has not shown it can refuse anything. The drill
builds a deliberately regressed candidate from the promoted version, plays the real
canary through the loop's own ``ContinualLoop.evaluate`` (same tasks, seeds, tools,
serving and ``gate.decide``), prints the decision in one block and stores it as a drill,
with every canary episode.

How the candidate is regressed (``perturb_lora``): the promoted adapter, or, when the
base model serves, a fresh LoRA of the loop's rank and targets (built as a cycle builds
its update, ``seed_agents.app.policy.build_policy``), gets Gaussian noise added to every
LoRA ``B`` matrix, scaled per layer so that the weight change it adds,
``scaling * dB @ A``, has ``strength`` times the Frobenius norm of that layer's base
weight. At the default strength 1, every linear layer's output moves by about as much as
its own signal, in all layers at once: the replies stop making sense, and the model plays
worse on any task the promoted version can do (docs/benchmarks.md, "Figures behind code
comments": what a strength does to one reply). The adapter keeps the loop's rank, so the server
loads it as it loads a cycle's candidate; it is written to ``<out>/drills/<time>-<pid>/adapter``.

Production never moves:

- the candidate is a registry version (served name ``{name}-v{N}``, ``metadata["drill"]``);
  the gateway serves only the promoted version, so no user request reaches it;
- its decision goes through ``VersionRegistry.record_drill``, which can only reject
  (``decide_version``, action ``drill``), even when the gate would promote; the promoted
  version is read back after the drill and printed;
- the candidate is unloaded whatever happens. A drill killed before its decision leaves
  its candidate undecided; the next drill discards it (the loop never decides it: it
  decides only its own cycle's candidate).
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from peft.tuners.lora import LoraLayer

from seed_agents.app.continual import ContinualLoop, load_adapter_weights, save_adapter
from seed_agents.app.continual_config import ContinualConfig
from seed_agents.app.policy import build_policy
from seed_agents.app.serving import Serving
from seed_agents.config import TrainConfig
from seed_agents.continual.gate import GateDecision
from seed_agents.continual.versions import VersionRegistry
from seed_agents.errors import ContinualError
from seed_agents.store import DecisionRecord, ModelVersionRecord, StoreError, TraceStore

__all__ = ["DrillOutcome", "lora_b_noise", "perturb_lora", "run_drill"]

METHOD = "gaussian noise on every LoRA B matrix, |scaling * dB @ A| = strength * |W| per layer"


# -------------------------------------------------------------------- the regression


def lora_b_noise(weight_OI: torch.Tensor, lora_a_RI: torch.Tensor, scaling: float, noise_OR: torch.Tensor,
                 strength: float) -> torch.Tensor:
    """``noise_OR`` scaled so that the weight change it makes as a LoRA ``B`` term,
    ``scaling * dB @ A``, has Frobenius norm ``strength * |W|``. Any layout of ``W``
    (a transposed Conv1D weight has the same norm)."""
    added_norm = (scaling * noise_OR @ lora_a_RI).norm()
    if not torch.isfinite(added_norm) or added_norm == 0:
        raise ContinualError("a LoRA A matrix is zero: noise on B cannot move that layer; is the adapter broken?")
    return noise_OR * (strength * weight_OI.norm() / added_norm)


@torch.no_grad()
def perturb_lora(model: Any, *, strength: float, seed: int) -> int:
    """Add ``lora_b_noise`` to every active LoRA ``B`` matrix of ``model`` (a PEFT model), in
    place, from a ``torch.Generator`` seeded with ``seed``; returns how many matrices moved."""
    generator = torch.Generator().manual_seed(seed)
    moved = 0
    for module in model.modules():
        if not isinstance(module, LoraLayer):
            continue
        for adapter in module.active_adapters:
            if adapter not in module.lora_B:
                continue
            b = module.lora_B[adapter].weight
            noise = torch.randn(b.shape, generator=generator, dtype=torch.float32)
            delta = lora_b_noise(module.get_base_layer().weight.float(), module.lora_A[adapter].weight.float(),
                                 float(module.scaling[adapter]), noise, strength)
            b.add_(delta.to(device=b.device, dtype=b.dtype))
            moved += 1
    if not moved:
        raise ContinualError("the drill's model has no LoRA layer to perturb (trainer.lora_r unset?)")
    return moved


def build_regressed_adapter(loop: ContinualLoop, promoted: ModelVersionRecord, out: Path, *, strength: float,
                            seed: int) -> tuple[Path, int]:
    """The promoted version's LoRA (a fresh one for the base model) with ``perturb_lora``'s
    noise, saved whole to ``out/adapter``; returns its folder and how many matrices moved."""
    tcfg = TrainConfig.model_validate(loop.cfg.train_fields(out, 1))
    policy = build_policy(tcfg, out)
    if promoted.path:
        load_adapter_weights(policy.model, promoted.path)
    moved = perturb_lora(policy.model, strength=strength, seed=seed)
    path = save_adapter(policy.model, out / "adapter").resolve()
    del policy
    gc.collect()
    return path, moved


# -------------------------------------------------------------------------- the drill


@dataclass
class DrillOutcome:
    """What a drill did; ``block()`` is what the CLI prints, ``caught`` its exit status."""

    name: str
    promoted: int
    candidate: int
    how: dict[str, Any]
    decision: GateDecision
    record: DecisionRecord
    serving_after: int | None
    episodes: int
    wall_s: float

    @property
    def caught(self) -> bool:
        """The gate refused the regressed candidate on the evidence (a ``reject``)."""
        return self.decision.verdict == "reject"

    def block(self) -> str:
        d, how = self.decision, self.how
        source = f"v{self.promoted}'s adapter" if how.get("from_adapter") else f"a fresh LoRA on v{self.promoted} (the base model)"
        means = (f"candidate {d.candidate_mean:.2f} vs promoted {d.promoted_mean:.2f} ({d.config.metric}, mean over "
                 f"{d.n_tasks} tasks)" if d.candidate_mean is not None and d.promoted_mean is not None else "no fault-free pairs")
        if d.verdict == "reject":
            result = "PASSED: the gate rejected the regressed candidate"
        elif d.verdict == "inconclusive":
            result = (f"NOT SHOWN: the gate did not promote it, but only as inconclusive ({d.reasons[0]}); give the "
                      f"canary tasks the promoted version solves, so it can show a regression")
        else:
            result = ("FAILED: the gate would have PROMOTED the regressed candidate (it was not: a drill never "
                      "promotes); make it stricter (gate.margin, gate.min_tasks, gate.floor, canary.seeds)")
        moved = "unchanged" if self.serving_after == self.promoted else \
            f"MOVED by another decision during the drill (now {_v(self.serving_after)}; the drill changes nothing)"
        candidate = (f"v{self.candidate}: {source} + Gaussian noise on {how.get('matrices', '?')} LoRA B matrices "
                     f"(strength {how.get('strength')}, noise seed {how.get('noise_seed')})")
        canary = (f"{means}; {self.episodes} episodes; faults {d.faults.get('candidate', 0)} vs "
                  f"{d.faults.get('promoted', 0)}")
        stored = (f"decision #{self.record.decision_id} (action drill, with its canary episodes); "
                  f"v{self.candidate} rejected, never served")
        rows = [("candidate", candidate), ("canary", canary), ("gate", d.summary()), ("drill", result),
                ("stored", stored), ("serving", f"v{self.promoted}, {moved} ({self.wall_s:.0f}s)")]
        head = f"drill of the gate on {self.name!r}: regressed v{self.candidate} vs promoted v{self.promoted}"
        return "\n".join([head, *(f"  {k + ':':<10} {v}" for k, v in rows)])


def run_drill(cfg: ContinualConfig, *, strength: float = 1.0, noise_seed: int = 0, store: TraceStore | None = None,
              serving: Serving | None = None, log: Callable[[str], None] = print) -> DrillOutcome:
    """Build the regressed candidate, play the canary, store the decision as a drill (see
    the module docstring). ContinualError when nothing is promoted yet."""
    t0 = time.perf_counter()
    loop = ContinualLoop(cfg, store=store, serving=serving, log=log, bootstrap=False)
    try:
        name, registry = cfg.name, loop.registry
        promoted = loop.store.promoted_version(name)
        if promoted is None:
            raise ContinualError(f"{name!r} has no promoted version in {cfg.store}: nothing to rehearse against; start "
                                 f"the loop once (`seed-agents continual --once`: it registers the base model as v0) or "
                                 f"promote one with `seed-agents versions promote N`")
        _discard_interrupted(registry, name)
        out = cfg.out / "drills" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        path, moved = build_regressed_adapter(loop, promoted, out, strength=strength, seed=noise_seed)
        how = {"method": METHOD, "strength": strength, "noise_seed": noise_seed, "matrices": moved,
               "from_version": promoted.version, "from_adapter": promoted.path or None}
        candidate = registry.add_candidate(name, str(path), metadata={"drill": how})
        try:
            decision, episodes = loop.evaluate(promoted, candidate)
        except BaseException:
            with contextlib.suppress(StoreError):
                registry.discard(name, candidate.version, actor="drill", reason="the drill's canary did not finish")
            raise
        finally:
            loop.serving.unload(candidate)
        record = registry.record_drill(name, candidate.version, decision, baseline=promoted.version,
                                       canary=episodes, how=how)
        after = loop.store.promoted_version(name)
        return DrillOutcome(name=name, promoted=promoted.version, candidate=candidate.version, how=how,
                            decision=decision, record=record, serving_after=None if after is None else after.version,
                            episodes=len(episodes), wall_s=time.perf_counter() - t0)
    finally:
        if store is None:
            loop.close()


def _discard_interrupted(registry: VersionRegistry, name: str) -> None:
    """Reject drill candidates a killed drill left undecided (nothing else decides them)."""
    for version in registry.pending(name):
        if version.metadata.get("drill"):
            registry.discard(name, version.version, actor="drill",
                             reason="left undecided by a drill that was stopped before its decision")


def _v(version: int | None) -> str:
    return "none" if version is None else f"v{version}"
