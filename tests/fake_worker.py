"""A stand-in for the GPU tuning worker, speaking the same JSON-lines protocol, for CPU tests
of the orchestration. It really crashes (SIGSEGV, abort), really exits, or really hangs when
told to, so the parent's isolation is exercised for real.

Like the real worker, it makes a bucket's inputs from their recipe when the kernel has an input
generator or a reference function (their errors are the build's). Its "timings" are SYNTHETIC test data (a formula of the config, below), not measurements.
Behaviour per config comes from the environment variable FAKE_WORKER, a JSON object:
  {"crash": [config, ...], "hang": [...], "abort": [...], "wrong": [...], "fatal": [...],
   "ms": {"<axis>=<value>": ms added, ...}, "base_ms": 1.0, "log": "<file to append ops to>",
   "sleep_ms": 0 (wall time each measurement takes, as a GPU's would), "cc": [9, 0] (the device's)}
"""

import json
import os
import signal
import sys
import time

PLAN = json.loads(os.environ.get("FAKE_WORKER", "{}"))


def matches(config, listed):
    return any(all(config.get(k) == v for k, v in item.items()) for item in listed)


def synthetic_ms(config):
    ms = PLAN.get("base_ms", 1.0)
    for k, v in config.items():
        ms += PLAN.get("ms", {}).get(f"{k}={v}", 0.0)
    return ms


def main():
    variants = {}
    out = sys.stdout
    for line in sys.stdin:
        msg = json.loads(line)
        if PLAN.get("log"):
            with open(PLAN["log"], "a") as f:
                f.write(msg["op"] + "\n")
        op = msg["op"]
        if op == "hello":
            reply = {
                "ok": True,
                "device": {
                    "name": "Fake GPU (CPU stand-in)",
                    "cc": PLAN.get("cc", [9, 0]),
                    "driver": "0.0",
                    "limits": {
                        "max_threads_per_block": 1024,
                        "max_registers_per_block": 65536,
                        "max_shared_memory_per_block": 49152,
                        "max_shared_memory_per_block_optin": 232448,
                    },
                },
            }
        elif op == "setup":
            variants = dict(msg["configs"])
            reply = {"ok": True}
            if msg.get("inputs", {}).get("generator") or msg.get("inputs", {}).get(
                "reference"
            ):  # the user's hooks run where the worker runs
                from hatch_autotune.tuning.inputs import InputError, InputRecipe

                recipe = InputRecipe.from_json(msg["inputs"])
                try:
                    recipe.reference_outputs(recipe.make())
                except InputError as exc:
                    reply = {"ok": False, "error": str(exc), "kind": "input"}
        elif op == "prepare":
            reply = {"ok": True}
        elif op in ("reference", "measure"):
            config = variants[msg["variant"]]
            if matches(config, PLAN.get("crash", [])):
                os.kill(os.getpid(), signal.SIGSEGV)
            if matches(config, PLAN.get("abort", [])):
                sys.stderr.write("fake worker: abort requested\n")
                sys.stderr.flush()
                os.abort()
            if matches(config, PLAN.get("hang", [])):
                time.sleep(3600)
            if matches(config, PLAN.get("fatal", [])):
                out.write(json.dumps({"ok": False, "fatal": True, "error": "CUDA_ERROR_ILLEGAL_ADDRESS (fake)"}) + "\n")
                out.flush()
                os._exit(3)
            if op == "reference":
                reply = {"ok": True}
            elif matches(config, PLAN.get("wrong", [])):
                reply = {"ok": True, "status": "rejected", "reason": "wrong result: y: 3 element(s) differ (fake)"}
            elif msg.get("timed") is False:  # verify only: the reference's cross-check
                reply = {"ok": True, "status": "ok", "phases": {"run": 0.0, "verify": 0.0}}
            else:
                time.sleep(PLAN.get("sleep_ms", 0) / 1000)
                ms = synthetic_ms(config)
                samples = [ms * (1 + 0.001 * (i % 3)) for i in range(9)]
                leader = msg.get("leader_ms")
                eliminated = leader is not None and min(samples) > leader * 1.25
                reply = {"ok": True, "status": "eliminated" if eliminated else "ok", "samples": samples[:5] if eliminated else samples}
        else:
            reply = {"ok": False, "error": f"unknown op {op}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
