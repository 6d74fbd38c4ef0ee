"""A stand-in for ``python -m fusetune`` in ``search --gpus`` and ``worker --gpus`` tests: answers
``[--cache-dir=X] search CONFIG --shape S --json ...`` with one result naming the GPU it was given, after
a progress line on stderr (a config named ``crash`` dies instead, as a child killed by a CUDA fault
would); ``--cache-dir=X worker ...`` writes what it was given to ``X/worker-gpu<N>.json``, and a search
whose cache folder exists writes it to ``X/search-gpu<N>-<shape>.json``: its arguments, the storage URL
its environment holds, and the pid it was told to die with."""
from __future__ import annotations

import json
import os
import sys
import time

cache = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--cache-dir=")]
args = [a for a in sys.argv[1:] if not a.startswith("--cache-dir")]
given = {"argv": sys.argv[1:], "storage": os.environ.get("FUSETUNE_STORAGE"),
         "die_with": os.environ.get("FUSETUNE_DIE_WITH_PARENT"), "parent": os.getppid()}
if args[0] == "worker":  # a worker per GPU: say which GPU and what it was given, in the cache folder
    with open(os.path.join(cache[0], f"worker-gpu{os.environ['CUDA_VISIBLE_DEVICES']}.json"), "w") as out:
        json.dump(given, out)
    sys.exit(0)
assert args[0] == "search" and args[2] == "--shape" and "--json" in args, args
config, shape = args[1], [int(x) for x in args[3].split(",")]
if cache and os.path.isdir(cache[0]):
    name = f"search-gpu{os.environ['CUDA_VISIBLE_DEVICES']}-{'x'.join(map(str, shape))}.json"
    with open(os.path.join(cache[0], name), "w") as out:
        json.dump(given, out)
print(f"searching {config} {shape}", file=sys.stderr, flush=True)
if os.path.basename(config) == "crash":
    print("fake: an illegal memory access", file=sys.stderr, flush=True)
    sys.exit(3)
time.sleep(0.3)
print(json.dumps({"machine": {}, "cache": "", "results": [{
    "config": config, "name": os.path.basename(config), "shape": shape, "key": "k", "status": "tuned",
    "time_ms": 1.0, "eager_ms": 2.0, "speedup": 2.0, "counts": {"ok": 1}, "winner": {}, "candidate": {},
    "seconds": 0.3, "message": os.environ["CUDA_VISIBLE_DEVICES"]}]}))
