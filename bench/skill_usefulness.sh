#!/usr/bin/env bash
# Do the skills move the policy? One table per analyzer, on the same held-out episodes.
#
# The policy is the stage-1 model that bench/sample_efficiency.py starts SEED from (built
# with that benchmark's default settings, or reused from its cache). It plays 8 eval_seen
# TextWorld games (never used in stage 1) x 4 episodes with the benchmark's rollout
# settings. Three analyzers write a skill about each of those same episodes:
#   rule-based-textworld   the offline stand-in (what stage 1 trained on)
#   policy:base            the base model, greedy (what SEED without stage 1 gets)
#   policy:stage1          the stage-1 model itself, greedy (what SEED gets at its start)
# `skills eval` then has the stage-1 policy re-score its own actions with and without each
# skill, and re-plays 8 tasks x 2 episodes with the skills in the prompt vs without.
#
#   bash bench/skill_usefulness.sh            # ~11 min on 2 CPU cores once stage 1 is cached
#
# The result (every analyzer's row, each scored episode and pair, the re-run, the settings)
# goes to docs/results/skill_usefulness.json (RESULTS_DIR to write it elsewhere).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/bench/skill_usefulness}
SA=.venv/bin/seed-agents
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT"
STARTED=$(date -u +%Y-%m-%dT%H:%M:%S+00:00)

STAGE1=$(.venv/bin/python bench/sample_efficiency.py --stage1-only | sed -n 's/^STAGE1_MODEL=//p')
[ -n "$STAGE1" ] || { echo "stage 1 failed" >&2; exit 1; }
echo "policy (stage-1 model): $STAGE1"

# the episodes, analyzed by the offline analyzer as they finish
$SA skills collect --out "$OUT/rule_based" --model "$STAGE1" --split eval_seen --num-tasks 8 --group 4 \
    --temperature 0.7 --max-tokens 12 --max-turns 3 --seed 0

# the same episodes, analyzed by the base model and by the stage-1 model (training's skill budget)
for name in base stage1; do
  model=smollm2-135m; [ "$name" = stage1 ] && model=$STAGE1
  cat > "$OUT/$name.yaml" <<EOF
analyzer: {kind: policy, name: "policy:$name", model: "$model", max_tokens: 128, max_concurrency: 8}
EOF
  $SA skills collect --config "$OUT/$name.yaml" --from-trajectories "$OUT/rule_based/trajectories.jsonl" \
      --out "$OUT/$name" || [ $? -eq 1 ]  # 1: some requests failed (a re-run retries them); the table counts what parsed
done

cat > "$OUT/eval.yaml" <<EOF
rerun: {enabled: true, max_tasks: 8, episodes_per_task: 2, sampling: {max_tokens: 12, temperature: 0.7},
        agent: {max_turns: 3, history: chat}}
EOF
$SA skills eval --config "$OUT/eval.yaml" --model "$STAGE1" --trajectories "$OUT/rule_based/trajectories.jsonl" \
    --examples "$OUT/rule_based/examples.jsonl" "$OUT/base/examples.jsonl" "$OUT/stage1/examples.jsonl" \
    --out "$OUT/eval"

.venv/bin/python - "$OUT" "$STAGE1" "${RESULTS_DIR:-docs/results}" "$STARTED" <<'EOF'
import json, sys
from pathlib import Path

sys.path.insert(0, ".")
from bench.results import write_result

out, stage1, results_dir, started = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
u = json.loads((out / "eval" / "usefulness.json").read_text())
# the settings above, as run; the paper's policy is a 3B model playing up to 30 turns
config = {"policy": Path(stage1).name, "model": "smollm2-135m", "split": "eval_seen", "num_tasks": 8, "group": 4,
          "temperature": 0.7, "max_tokens": 12, "max_turns": 3, "skill_max_tokens": 128, "rerun_tasks": 8,
          "rerun_episodes_per_task": 2, "seed": 0, "skills_eval": u.get("config", {})}
write_result("skill_usefulness", config,
             {k: u.get(k) for k in ("rows", "rerun", "pairs", "episodes", "counts", "wall_s")},
             paper={"model": "Qwen2.5-3B-Instruct", "max_turns": 30},
             labels={"model": "base model", "max_turns": "max turns"}, started_at=started, results_dir=results_dir)
EOF
