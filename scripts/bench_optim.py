"""Optimizer-step benchmark: every method against torch's fused AdamW, measured in the same run.

The command line of ``tools.bench_optim``, which holds the logic (``--help`` for its options).

    python scripts/bench_optim.py                       # llama_60m + llama_130m, fp32 + bf16
    python scripts/bench_optim.py --models llama_60m --dtypes bf16 --methods adamw_fused foam2
    python scripts/bench_optim.py --out results/bench/optim_cpu.md
    python scripts/bench_optim.py --host-cost --models llama_60m llama_1b llama_7b
    python scripts/bench_optim.py --floor               # each step over its own byte floor
"""

from tools.bench_optim import main

if __name__ == "__main__":
    main()
