"""Records what the launcher handed this worker: --env variables, CPU affinity, the contract."""

import json
import os
import sys

from accel_state.contract import LaunchContract

out_dir = sys.argv[1]
contract = LaunchContract.from_env()
rank = os.environ.get("RANK", "0")
record = {
    "env": {key: os.environ.get(key) for key in ("GREETING", "EMPTY", "ACCELERATE_CPU_AFFINITY")},
    "affinity": sorted(os.sched_getaffinity(0)),
    "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
    "world_size": int(os.environ.get("WORLD_SIZE", "1")),
    "regional_compilation": contract.dynamo_use_regional_compilation,
    "fsdp_config": contract.fsdp_config,
}
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
    json.dump(record, handle)
