"""The tuning worker's child process: `main`, the loop serving requests on stdin.

Run as `python -m hatch_autotune.tuning.worker` (worker_client.py starts it), it owns one device.
What it does per request is worker_state.py's, its device buffers worker_memory.py's; the
messages, one JSON object per line each way, are protocol.py's.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from ..runtime import CudaCallError
from .inputs import InputError
from .protocol import Failure, Reply, parse_request
from .worker_state import Fatal, WorkerState

_WorkerState = WorkerState  # the name tests/standin_worker.py wraps `handle` on


def main() -> None:
    """Serve requests on stdin; replies go to the original stdout, everything else to stderr."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints from libraries must not corrupt the protocol
    state = WorkerState()
    for line in sys.stdin:
        raw: Any = None
        try:
            raw = json.loads(line)
            reply: Reply = state.handle(parse_request(raw))
        except (Fatal, CudaCallError) as exc:
            if isinstance(exc, CudaCallError) and isinstance(raw, dict) and raw.get("op") == "hello":
                # the device was never used: the tuner reports it (it cannot open the device)
                reply = Failure(f"{type(exc).__name__}: {exc}")
            else:  # an error on the bucket's context: its memory and kernels cannot be trusted
                protocol.write(json.dumps(Failure(str(exc), fatal=True).to_json()) + "\n")
                protocol.flush()
                os._exit(3)
        except InputError as exc:  # the user's generator or reference: the build's error, with their message
            reply = Failure(str(exc), kind="input")
        except Exception as exc:
            reply = Failure(f"{type(exc).__name__}: {exc}")
        protocol.write(json.dumps(reply.to_json()) + "\n")
        protocol.flush()
    state.close()


if __name__ == "__main__":
    main()
