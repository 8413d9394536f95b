"""``make gpu-check``: the one prepared run for a lent GPU, offline, with the machine's own torch.

The command line of ``repro.gpu_check``, which holds the logic.

    python scripts/gpu_check.py wheels --dest gpu-wheels      # make gpu-wheels (needs an index)
    PYTHONPATH=. python scripts/gpu_check.py install          # offline: what the machine lacks
    PYTHONPATH=.gpu-site:. python scripts/gpu_check.py run    # the check (make gpu-check)
"""

from repro.gpu_check import main

if __name__ == "__main__":
    main()
