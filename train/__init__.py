"""The trainer: pre-training (``pretrain.py``, the Hydra entry point, and the pieces it calls), with
its rooms: ``data/`` (corpus, tokenizer, batching, validation sets, data positions), ``export/``
(transformers checkpoints, consolidated shards) and ``finetune/`` (GLUE / MMLU on
``transformers.Trainer``, a package of its own)."""
