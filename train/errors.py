"""The trainer's error types, in a leaf module that imports nothing.

A module that only needs to *raise* a config error (the data pipeline, the checkpoint, the
update-cosine metric) imports this file, not ``train/config.py``, which pulls in foam, models,
the loggers and parallelism to check a config. The entry point turns ``ConfigError`` (and so
``DataSourceError``) into one line and exit status 2, ``TrainingDiverged`` into its own status.
"""


class ConfigError(ValueError):
    """An invalid configuration; the message starts with the key to fix."""


class DataSourceError(ConfigError):
    """The data source cannot be opened or holds no usable text; the message names the key."""


class TrainingDiverged(RuntimeError):
    """The loss or gradient norm stopped being finite: the run stops before anything is saved."""


SAVE_FAILED_EXIT_STATUS = 74
"""sysexits.h EX_IOERR: a checkpoint could not be written (``CheckpointSaveFailed``); the previous
one is still the newest and loads, so rerunning once the storage is fixed resumes from it."""


class CheckpointSaveFailed(RuntimeError):
    """A checkpoint was not saved: any rank's write error, or rank 0's publishing step. Raised on
    every rank with the same one line (the failing rank, the errno and the path)."""
