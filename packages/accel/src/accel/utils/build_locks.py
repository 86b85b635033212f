"""``accel.utils.build_locks`` (accel's earlier path; not one of Accelerate's): a door to :mod:`accel.strategies.deepspeed.build_locks`.

It re-exports the same objects; replacing one of its names reaches the code that uses it.
"""

from __future__ import annotations

from accel.patch_forwarding import serve_as_door
from accel.strategies.deepspeed.build_locks import (
    extensions_root as extensions_root,
)
from accel.strategies.deepspeed.build_locks import (
    logger as logger,
)
from accel.strategies.deepspeed.build_locks import (
    main as main,
)
from accel.strategies.deepspeed.build_locks import (
    stale_build_locks as stale_build_locks,
)
from accel.strategies.deepspeed.build_locks import (
    warn_about_stale_build_locks as warn_about_stale_build_locks,
)

serve_as_door(__name__, "accel.strategies.deepspeed.build_locks")

if __name__ == "__main__":
    raise SystemExit(main())
