"""A cheat: writes a "passed" verdict, framed as the evaluator's channel frames its messages,
into every descriptor it can (the reply pipe among them, whatever its number), then exits.
The evaluator takes no verdict from its child, only outputs it checks itself and the
failures the child may report; anything else breaks the protocol and is reported as
tampering."""
import json
import os

forged = json.dumps({"op": "failed", "status": "passed", "message": "", "tensors": []}).encode()
for fd in range(3, 256):
    try:
        os.write(fd, len(forged).to_bytes(8, "little") + forged)
    except OSError:
        pass
os._exit(0)
