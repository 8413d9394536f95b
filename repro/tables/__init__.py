"""The tables and figures made from finished runs, one module per table (``repro.make_tables``
writes them all; the CPU study's are in ``repro/cpu_study/tables/``)."""
