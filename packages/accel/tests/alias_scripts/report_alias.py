"""Writes what ``import accelerate`` gives in this process to the file named by argv[1]."""

import importlib.metadata
import json
import os
import sys

import accelerate
import accelerate.utils

import accel

record = {
    "argv": sys.argv[1:],
    "version": accelerate.__version__,
    "metadata": importlib.metadata.version("accelerate"),
    "same_accelerator": accelerate.Accelerator is accel.Accelerator,
    "utils_is_accel": accelerate.utils is sys.modules["accel.utils"],
    "rank": int(os.environ.get("RANK", "0")),
    "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
}
if record["restart"] == 0 and os.environ.get("FAIL_FIRST_ATTEMPT") == "1":
    raise SystemExit("first attempt fails on purpose")
with open(f"{sys.argv[1]}.{record['rank']}", "w") as handle:
    json.dump(record, handle)
if os.environ.get("EXIT_WITH"):
    raise SystemExit(int(os.environ["EXIT_WITH"]))
