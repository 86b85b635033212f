"""Started by ``accel launch --use_fsdp ...``: trains with FSDP from the launcher's settings only.

Usage: ``fsdp_launch_script.py OUTPUT_DIR``; each rank writes ``rank<i>.json``.
"""

import json
import sys
from pathlib import Path

import fsdp_workers

if __name__ == "__main__":
    result = fsdp_workers.launched_script_losses(size=8, steps=3)
    rank = result.pop("rank")
    Path(sys.argv[1], f"rank{rank}.json").write_text(json.dumps(result))
