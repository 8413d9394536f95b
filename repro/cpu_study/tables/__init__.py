"""The CPU study's tables, one module per table (``repro.cpu_study.make_tables`` writes them)."""
