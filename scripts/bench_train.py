"""End-to-end training throughput: tokens/s and peak memory of each optimizer, as ratios to AdamW.

The command line of ``tools.bench_train``, which holds the logic (``--help`` for its options).

    python scripts/bench_train.py                                  # llama_1m, fp32, CPU
    python scripts/bench_train.py --compile --out results/bench/train_cpu.md
    python scripts/bench_train.py --model llama_350m --precision bf16 --memory-cap 16 \
        --optimizers adamw foam2 foam_mini                         # throughput at a cap (CUDA)
"""

from tools.bench_train import main

if __name__ == "__main__":
    main()
