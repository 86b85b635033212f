"""Run with -m: writes its rank and arguments."""

import json
import os
import sys

if __name__ == "__main__":
    out_dir = sys.argv[1]
    with open(
        os.path.join(out_dir, f"module_rank{os.environ.get('RANK', '0')}.json"), "w"
    ) as handle:
        json.dump({"argv": sys.argv[2:], "name": __name__}, handle)
