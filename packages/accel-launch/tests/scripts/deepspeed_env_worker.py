"""Records the rank and the DeepSpeed part of the launch contract this worker was handed."""

import json
import os
import sys

record = {
    "rank": int(os.environ.get("RANK", "-1")),
    "world_size": int(os.environ.get("WORLD_SIZE", "1")),
    "use_deepspeed": os.environ.get("ACCEL_USE_DEEPSPEED"),
    "deepspeed_config": json.loads(os.environ.get("ACCEL_DEEPSPEED_CONFIG") or "null"),
    "use_cpu": os.environ.get("ACCEL_USE_CPU"),
}
with open(os.path.join(sys.argv[1], f"rank{record['rank']}.json"), "w") as handle:
    json.dump(record, handle)
