#!/usr/bin/env python3
"""The peer harness's memory-trace replay (bench/peers/peer.py: peak_report), on a hand-written
caching-allocator event trace. peer.py imports torch at its top, which this machine lacks, so the
three functions are taken from its source. Expected values are worked out by hand below.
  python3 tests/test_peer_trace.py [SOURCE_DIR]"""
import ast
import os
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
src = open(os.path.join(root, "bench", "peers", "peer.py")).read()
ns = {}
for node in ast.parse(src).body:
    if isinstance(node, ast.FunctionDef) and node.name in ("short_path", "frame_keys", "peak_report"):
        exec(compile(ast.Module([node], []), "peer.py", "exec"), ns)


def frames(*where):
    """Innermost first, as the allocator records them."""
    return [{"filename": "/venv/lib/python3.12/site-packages/" + f, "line": l, "name": n} for f, l, n in where]


linear = ("torch/nn/modules/linear.py", 134, "forward")
attn = ("transformers/models/x/modeling_x.py", 42, "forward")
softmax = ("torch/nn/functional.py", 2161, "softmax")
trace = [
    {"action": "segment_alloc", "addr": 1000, "size": 100, "frames": frames(linear, attn)},   # reserved 50 -> 150
    {"action": "alloc", "addr": 1000, "size": 60, "frames": frames(linear, attn)},            # allocated 10 -> 70
    {"action": "alloc", "addr": 1060, "size": 30, "frames": frames(softmax)},                  # 100
    {"action": "free_requested", "addr": 1000, "size": 60},                                   # not yet free
    {"action": "free_completed", "addr": 1000, "size": 60},                                   # 40
    {"action": "segment_alloc", "addr": 5000, "size": 200, "frames": []},                     # reserved 350
    {"action": "alloc", "addr": 5000, "size": 150, "frames": []},                             # 190: the peak
    {"action": "free_completed", "addr": 1060, "size": 30},                                   # 160
    {"action": "free_completed", "addr": 5000, "size": 150},                                  # 10
    {"action": "segment_free", "addr": 5000, "size": 200},                                    # reserved 150
]
r = ns["peak_report"](trace, 10, 50)
failures = []


def check(what, got, want):
    if got != want:
        failures.append(f"{what}: {got!r}, expected {want!r}")


pa, pr = r["at_peak_allocated"], r["at_peak_reserved"]
# The allocated peak: 10 before the step + 30 (softmax) + 150 (no frame) = 190, after event 7.
check("peak allocated bytes", pa["allocated_bytes"], 190)
check("peak allocated event", pa["event"], 7)
check("allocated before the step", pa["allocated_before_step_bytes"], 10)
check("allocated in the step", pa["allocated_in_step_bytes"], 180)
check("by operation", pa["by_operation"],
      [{"where": "(no Python frame)", "bytes": 150}, {"where": "torch/nn/functional.py:2161 softmax", "bytes": 30}])
# The reserved peak (350) lasts from event 6 to event 8; its moment is the most allocated in it: 190.
check("peak reserved bytes", pr["reserved_bytes"], 350)
check("reserved peak's allocated", pr["allocated_bytes"], 190)
# Free inside the new segments there: 100 - 30 and 200 - 150; the first one's creator is the
# innermost model line of the allocation that made it (transformers, not torch's linear).
check("free in new segments", pr["segments_new_free_bytes"], 120)
check("largest new segments", pr["largest_new_segments"],
      [{"bytes": 200, "free_bytes": 50, "created_by": "(no Python frame)"},
       {"bytes": 100, "free_bytes": 70, "created_by": "transformers/models/x/modeling_x.py:42 forward"}])
check("owner of the 60-byte block", ns["frame_keys"](frames(linear, attn)),
      ("torch/nn/modules/linear.py:134 forward", "transformers/models/x/modeling_x.py:42 forward"))
if failures:
    print("peer trace: " + "; ".join(failures), file=sys.stderr)
    sys.exit(1)
print("peer trace: 11 checks passed")
