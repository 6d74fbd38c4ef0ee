"""A stand-in for ``python -m fusetune`` in ``search --gpus`` and ``worker --gpus`` tests: answers
``[--cache-dir=X] search CONFIG --shape S --json ...`` with one result naming the GPU it was given, after
a progress line on stderr (a config named ``crash`` dies instead, as a child killed by a CUDA fault
would); ``--cache-dir=X worker ...`` writes its arguments to ``X/worker-gpu<N>.json``."""
from __future__ import annotations

import json
import os
import sys
import time

cache = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--cache-dir=")]
args = [a for a in sys.argv[1:] if not a.startswith("--cache-dir")]
if args[0] == "worker":  # a worker per GPU: say which GPU and what it was asked, in the cache folder
    with open(os.path.join(cache[0], f"worker-gpu{os.environ['CUDA_VISIBLE_DEVICES']}.json"), "w") as out:
        json.dump(args, out)
    sys.exit(0)
assert args[0] == "search" and args[2] == "--shape" and "--json" in args, args
config, shape = args[1], [int(x) for x in args[3].split(",")]
print(f"searching {config} {shape}", file=sys.stderr, flush=True)
if os.path.basename(config) == "crash":
    print("fake: an illegal memory access", file=sys.stderr, flush=True)
    sys.exit(3)
time.sleep(0.3)
print(json.dumps({"machine": {}, "cache": "", "results": [{
    "config": config, "name": os.path.basename(config), "shape": shape, "key": "k", "status": "tuned",
    "time_ms": 1.0, "eager_ms": 2.0, "speedup": 2.0, "counts": {"ok": 1}, "winner": {}, "candidate": {},
    "seconds": 0.3, "message": os.environ["CUDA_VISIBLE_DEVICES"]}]}))
