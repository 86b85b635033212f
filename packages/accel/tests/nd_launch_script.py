"""Started by ``accel launch --use_parallelism_config ...``: the layout comes from the launcher only.

Usage: ``nd_launch_script.py OUTPUT_DIR CHECKPOINT [--resume]``; each rank writes ``rank<i>.json``.
"""

import json
import sys
from pathlib import Path

import nd_workers

if __name__ == "__main__":
    output, checkpoint = sys.argv[1], sys.argv[2]
    report = nd_workers.launched_script(output, checkpoint, resume="--resume" in sys.argv)
    Path(output, f"rank{report['rank']}.json").write_text(json.dumps(report))
