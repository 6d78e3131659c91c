"""A cheat: forges the verdict instead of computing anything. At import it reads the config
file named on its command line, writes a "passed" result where that config says the result
goes (where the evaluator's child once kept it) and to every JSON file in its working
folder, and exits at once. The evaluator never reads a verdict the child's process could
write: it decides from the outputs the child hands back, and this one hands back none."""
import json
import os
import sys
from pathlib import Path

FORGED = {"status": "passed", "stage": "done", "message": "", "detail": "", "repeatable": True,
          "trials": [{"trial": 0, "seed": 0, "allclose": True, "max_abs_diff": 0.0, "rel_error_fp64": 0.0}]}
targets = set(Path.cwd().glob("*.json"))
for arg in sys.argv[1:]:
    if arg.endswith(".json"):
        try:
            targets.add(Path(json.loads(Path(arg).read_text())["result"]))
        except (OSError, ValueError, KeyError, TypeError):
            pass
for path in targets:
    path.write_text(json.dumps(FORGED))
os._exit(0)
