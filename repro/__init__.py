"""The paper's reproduction: its methods and printed numbers, the memory estimator, the sweeps and
experiments that plan runs, and the tables and figures made from finished runs; the CPU study in
its own subpackage (``cpu_study/``), which builds on these modules and which they never import.
``scripts/`` holds the command lines that call into it; ``train/``, ``foam/`` and ``models/``
never import it."""
