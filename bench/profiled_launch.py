"""``python -m trainer.pipeline`` under cProfile, imports included (bench_restart.py --profile).

    python bench/profiled_launch.py OUT.prof <trainer.pipeline flags>

Profiles the main thread from before the trainer's first import to ``main``'s return (the SIGINT exit),
writes the stats to ``OUT.prof`` and the 60 biggest cumulative entries to ``OUT.prof.txt``, then exits with
the trainer's code. Start-up is the part worth reading: the step loop's time is mostly in kernels.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys


def main() -> None:
    out, argv = sys.argv[1], sys.argv[2:]
    prof = cProfile.Profile()
    prof.enable()
    from trainer import pipeline

    code = pipeline.main(argv)
    prof.disable()
    prof.dump_stats(out)
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(60)
    with open(out + ".txt", "w", encoding="utf-8") as f:
        f.write(text.getvalue())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
