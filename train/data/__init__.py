"""The data pipeline: where records come from (``corpus``), their tokens (``tokenizer``), the
training stream and its position (``loader``, ``batcher``, ``position``), the evaluation sets
(``val_batches``) and the fingerprint a checkpoint keeps of what it trained on
(``fingerprint``)."""
