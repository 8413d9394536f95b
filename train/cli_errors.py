"""Every config error of ``train/pretrain.py`` is one line on stderr and exit status 2, Hydra's own
included: an unknown choice (``+optim=fom2``), a misspelt key (``trainer.max_step=3``), a value of
the wrong type, an override that does not parse.

Hydra reports what it cannot compose itself (``hydra/_internal/utils.py: run_and_report``): a
message of several lines, an advice to ``+``-append a misspelt key, the config search path, and
exit status 1. ``HYDRA_FULL_ERROR=1`` is Hydra's switch to raise the exception instead, so the entry
point sets it and reads the exception's own fields: ``MissingConfigException`` carries the missing
option and the group's options, and a refused override carries OmegaConf's error as its cause,
with the key and the schema it was checked against. A crash of the run itself then shows Python's
whole traceback (exit status 1), as it would without Hydra.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NoReturn

from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from train.schema import unknown_key_message

CONFIG_ERROR_STATUS = 2
HYDRA_SUBDIR = ".hydra"  # what Hydra writes into a run directory before the run starts
HYDRA_SUBDIR_FILES = {"config.yaml", "hydra.yaml", "overrides.yaml"}


def exit_config_error(message: str) -> NoReturn:
    """Print ``error: message`` as the run's one line on stderr and exit with status 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(CONFIG_ERROR_STATUS)


def discard_refused_run_dir(run_dir: Path, log_name: str) -> None:
    """Take back the run directory a refused command made, so that mistyped commands leave no
    ``runs/<time>_None_foam2`` behind: Hydra creates the directory (its ``.hydra/`` and the log
    ``log_name``) before the run reads its config, and the run writes ``config.yaml``. Only when
    that is all it holds: a directory with anything else (a checkpoint, metrics, a file of the
    user's) is left as it was, so resuming with a bad override loses nothing."""
    started = {log_name, "config.yaml"}
    if not run_dir.is_dir() or run_dir.resolve() == Path.cwd().resolve():
        return
    entries = list(run_dir.iterdir())
    for entry in entries:
        if entry.name == HYDRA_SUBDIR and entry.is_dir() and not entry.is_symlink():
            if not {f.name for f in entry.iterdir()} <= HYDRA_SUBDIR_FILES:
                return
        elif not (entry.name in started and entry.is_file()):
            return
    for entry in entries:
        if entry.is_dir():
            for inner in entry.iterdir():
                inner.unlink()
            entry.rmdir()
        else:
            entry.unlink()
    run_dir.rmdir()


def unknown_choice_message(group: str, name: str, choices: list[str]) -> str:
    """An option the group does not have: the closest one, and every option of the group."""
    close = difflib.get_close_matches(name, choices, n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"{group}={name}: no such {group} config{hint} (options: {', '.join(choices)})"


def check_choices(
    parser: argparse.ArgumentParser, group: str, names: Iterable[str], choices: list[str]
) -> None:
    """A script's names of configs (``--model``, ``--methods``): the first one ``choices`` lacks
    ends the script as ``parser.error`` does, with :func:`unknown_choice_message`'s line."""
    for name in names:
        if name not in choices:
            parser.error(unknown_choice_message(group, name, choices))


def value_error_message(err: OmegaConfBaseException) -> str:
    """A value OmegaConf refuses (wrong type) or cannot resolve (``${...}`` to nowhere): the key,
    the value as given when OmegaConf has it, and its reason without the details it appends."""
    given = "" if err.value is None else f"={err.value}"
    return f"{err.full_key}{given}: {err.msg.splitlines()[0]}"


def composition_error_message(err: ConfigCompositionException | OverrideParseException) -> str:
    """One line for what Hydra could not compose, from the exception's fields where it has them."""
    if isinstance(err, MissingConfigException) and err.missing_cfg_file and err.options:
        group, _, name = err.missing_cfg_file.rpartition("/")
        return unknown_choice_message(group, name, sorted(err.options))
    # A refused override chains OmegaConf's error as the cause; a refused config file (a misspelt
    # key in trainer/mine.yaml) as the context of Hydra's exception.
    cause = err.__cause__ or err.__context__
    if isinstance(cause, ConfigAttributeError | ConfigKeyError) and cause.full_key:
        return unknown_key_message(cause.full_key, cause.object_type)
    if isinstance(cause, OmegaConfBaseException) and cause.full_key:  # a value of the wrong type
        return value_error_message(cause)
    # The rest (an override that does not parse, two values for one group, ...) has no fields to
    # read: Hydra's message, on one line.
    return "; ".join(line.strip() for line in str(err).splitlines() if line.strip())


def run_reporting_config_errors(app: Callable[[], None]) -> None:
    """Run the ``@hydra.main`` function ``app``; a config Hydra cannot compose exits 2 with one
    line instead of Hydra's report."""
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        app()
    except (ConfigCompositionException, OverrideParseException) as err:
        exit_config_error(composition_error_message(err))
