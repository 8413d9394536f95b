"""A run's model out of the trainer: as a transformers checkpoint (``hf``, and its command line
``cli``), and as one file from a checkpoint's shards (``consolidate``)."""
