"""Run an unmodified script with ``import accelerate`` served by accel.

    python -m accel.as_accelerate train.py --lr 1e-4
    python -m accel.as_accelerate -m my_package.train

One process. For several, ``accel launch --as-accelerate train.py``: it sets
``ACCEL_AS_ACCELERATE=1`` for its workers, and accel's start-up hook installs the alias in each.
The variable is set here too, so that processes the script starts (DataLoader workers, spawned
helpers) get the alias as well.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Sequence

from accel.accelerate_alias import AS_ACCELERATE_ENV, install_as_accelerate

_USAGE = "usage: python -m accel.as_accelerate (script.py | -m module) [args...]"


def main(argv: Sequence[str] | None = None) -> None:
    """Install the alias, then run the script (or ``-m`` module) as ``__main__``.

    Raises:
        SystemExit: No script was named (status 2, with the usage line).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_USAGE, file=sys.stderr if not args else sys.stdout)
        raise SystemExit(2 if not args else 0)
    os.environ[AS_ACCELERATE_ENV] = "1"
    install_as_accelerate()
    if args[0] == "-m":
        if len(args) < 2:
            print(_USAGE, file=sys.stderr)
            raise SystemExit(2)
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        return
    script = args[0]
    if not os.path.exists(script):
        print(
            f"python -m accel.as_accelerate: no such script {script!r}\n{_USAGE}", file=sys.stderr
        )
        raise SystemExit(2)
    sys.argv = [script, *args[1:]]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
