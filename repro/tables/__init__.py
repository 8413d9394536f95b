"""The tables and figures made from finished runs, one module per table (``repro.make_tables``
writes them all)."""
