"""``make gpu-check OUT=DIR``: the one prepared run for a lent GPU, offline, with the machine's
own torch; everything it makes lands in DIR as each section finishes.

The command line of ``tools.gpu_check`` (the check) and ``tools.gpu_deps`` (the wheels).

    python scripts/gpu_check.py wheels --dest gpu-wheels --box-python 3.12  # make gpu-wheels
    PYTHONPATH=. python scripts/gpu_check.py install       # make gpu-deps: offline, then imports
    PYTHONPATH=.gpu-site:. python scripts/gpu_check.py run --out DIR       # make gpu-check OUT=DIR
"""

from tools.gpu_check import main

if __name__ == "__main__":
    main()
