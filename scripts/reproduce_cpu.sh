#!/usr/bin/env bash
# The scaled-down CPU reproduction of Table 2 and the ablations committed under results/repro.
#
#   bash scripts/reproduce_cpu.sh            # runs into runs/repro (skips finished points)
#   bash scripts/reproduce_cpu.sh --dry-run  # prints the commands
#
# LLaMA-1M (configs/model/llama_1m.yaml) on tinyshakespeare, the project's 2048-piece
# SentencePiece tokenizer, packed 128-token sequences, 16 sequences per step, 200 steps
# (409,600 training tokens, about 1.3 epochs), fp32, 2 seeds; validation on a 10% held-out split.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
ROOT=${ROOT:-runs/repro}
DATA=${DATA:-$(cd .. && pwd)/shared/data/tinyshakespeare.txt}
SEEDS=(0 1)
COMMON=(
  trainer=cpu_debug logger=none trainer.max_steps=200 trainer.global_batch_size=16
  trainer.micro_batch_size=16 trainer.eval_every=25 trainer.eval_tokens=40000 trainer.save_every=0
  data=local "data.path=$DATA" data.spm_vocab_size=2048 data.pack=true data.seq_len=128
  data.val_fraction=0.1
)
sweep() { "$PY" scripts/sweep.py --model llama_1m --seeds "${SEEDS[@]}" --root "$ROOT" "$@"; }

# Table 2 at this scale: a reduced lr sweep, alpha at each method's paper value. The lr-only
# methods' grids reach past the first sweep's edges (AdamW and Adam-mini were best at its lowest
# lr, Muon at its highest).
sweep --methods adamw adam_mini --lrs 1e-3 2.5e-3 5e-3 1e-2 "${@}" -- "${COMMON[@]}"
sweep --methods muon --lrs 2.5e-3 5e-3 1e-2 2e-2 "${@}" -- "${COMMON[@]}"
# The alpha methods' grids likewise reach one step past where the first sweep (5e-3 .. 2e-2) had
# its best point at an edge.
sweep --methods foam2 foam3 foam_mini apollo_mini --lrs 2.5e-3 5e-3 1e-2 2e-2 --config-alpha \
  "${@}" -- "${COMMON[@]}"
sweep --methods galore_1_4 --lrs 5e-3 1e-2 2e-2 4e-2 --config-alpha "${@}" -- "${COMMON[@]}"
sweep --methods apollo_1_4 --lrs 5e-3 1e-2 2e-2 --config-alpha "${@}" -- "${COMMON[@]}"

# Ablations at FOAM-2's paper lr (1e-2, alpha 0.25): fold level (Figure 6a), residual (Figure 7),
# second moment from the square of the mean vs the mean of squares.
for level in 1 4 5; do
  sweep --methods "foam$level" --lrs 1e-2 --config-alpha "${@}" -- "${COMMON[@]}"
done
sweep --methods foam2 --name foam2_no_residual --lrs 1e-2 --config-alpha "${@}" -- \
  "${COMMON[@]}" optim.residual=false
sweep --methods foam2 --name foam2_no_residual_in_v --lrs 1e-2 --config-alpha "${@}" -- \
  "${COMMON[@]}" optim.residual_in_second_moment=false
sweep --methods foam2 --name foam2_mean_of_squares --lrs 1e-2 --config-alpha "${@}" -- \
  "${COMMON[@]}" optim.second_moment=mean_of_squares
# The paper's control for FOAM's alpha (Appendix, "Adam with module-wise learning rate"): AdamW
# with the attention/MLP matrices at lr x 0.25, everything else at lr.
sweep --methods adamw --name adamw_module_wise_lr --lrs 1e-2 "${@}" -- "${COMMON[@]}" optim.alpha=0.25

# FOAM-2 with the authors' release semantics (foam.optimizer.SEMANTICS) at FOAM-2's best lr of the
# sweep above (5e-3), 3 seeds; make_tables pairs it with FOAM-2 over their common seeds.
sweep --methods foam2_release --name ablation_foam2_release --lrs 5e-3 --config-alpha \
  --seeds 0 1 2 "${@}" -- "${COMMON[@]}"
