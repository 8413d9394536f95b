"""The paper's reproduction: its methods and printed numbers, the memory estimator, the sweeps and
experiments that plan runs, the CPU study's driver and the tables and figures made from finished
runs. ``scripts/`` holds the command lines that call into it; ``train/``, ``foam/`` and
``models/`` never import it."""
