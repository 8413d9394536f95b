"""The CPU study (results/repro/PROTOCOL.md): the scaled-down reproduction of Table 2 and the FOAM
ablations on a 2-core machine. Its driver (``study``, v4's ``v4``, the command line ``cli``), the
slots it runs in (``scheduler``), the guards on its corpus and packages (``environment``), its
corpora (``corpora``, ``make_corpus``) and its tables (``tables/``, written beside the paper's by
``make_tables``). It builds on the paper's modules in ``repro/``; they never import it."""
