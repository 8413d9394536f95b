"""Fine-tuning a pre-trained model on GLUE or MMLU (the paper's fine-tuning tables), on
``transformers.Trainer``: ``cli`` (the command line, into ``args.FinetuneArgs``), ``recipes`` (the
two benchmarks), ``methods`` (Full-Adam, FOAM, GaLore, APOLLO, LoRA), ``tasks`` (the data) and
``metrics`` (the paper's scores). It shares with pre-training only named pieces: the hub check
(``train.data.corpus``), the loss's ignore index (``train.objective``) and the git sha
(``train.summary``)."""
