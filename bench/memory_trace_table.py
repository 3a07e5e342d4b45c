#!/usr/bin/env python3
"""Prints the memory traces of bench/peer_memory_trace.sh beside the model's breakdown.

For each report (peer.py --memory-trace): the configuration, the planner's predicted peak
allocated and reserved (`planner explain --json`, the committed profile), the traced run's
peak allocated and reserved, what was live at the allocated peak (bytes before the step,
bytes the step allocated, by the model or engine code that asked), and at the reserved peak
the free bytes inside the segments the steps created.
  python3 bench/memory_trace_table.py PLANNER DIR [DIR...] [--top N]
"""
import glob
import json
import os
import subprocess
import sys

GIB = 2.0**30


def planner_prediction(planner, rep):
    c = rep["config"]
    argv = [planner, "explain", "--model", rep["model"], "--gpus", str(c["gpus"]), "--engine", c["engine"],
            "--hardware", "h200-sxm", "--json", "--stage", str(c["zero_stage"]), "--micro-batch", str(c["micro_batch"]),
            "--gas", str(c["gas"]), "--seq", str(c["seq_len"]), "--precision", c["precision"],
            "--checkpointing", "on" if c["activation_checkpointing"] else "off",
            "--offload-optimizer", c["offload_optimizer"], "--offload-params", c["offload_params"],
            "--attention", c["attention"]]
    out = subprocess.run(argv, capture_output=True, text=True)
    if out.returncode != 0:
        return None
    return json.loads(out.stdout)["plans"][0]["gpu_memory_bytes"]


def main():
    args = sys.argv[1:]
    top = 8
    if "--top" in args:
        i = args.index("--top")
        top = int(args[i + 1])
        del args[i:i + 2]
    if len(args) < 2:
        sys.exit("usage: memory_trace_table.py PLANNER DIR [DIR...] [--top N]")
    planner, dirs = args[0], args[1:]
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "*.json"))):
            if path.endswith((".plan.json", ".deepspeed.json")):
                continue
            rep = json.load(open(path))
            c = rep["config"]
            pred = planner_prediction(planner, rep)
            print(f"== {os.path.basename(path)}: {rep['model']} {c['engine']} stage {c['zero_stage']} "
                  f"{c['precision']} {c['micro_batch']} x {c['seq_len']} GAS {c['gas']} ckpt "
                  f"{'on' if c['activation_checkpointing'] else 'off'} attention {c['attention']} offload "
                  f"{c['offload_optimizer']}/{c['offload_params']}; {rep['events']} events"
                  f"{' (TRUNCATED)' if rep.get('trace_truncated') else ''}")
            if pred:
                print(f"   predicted: peak allocated {pred['peak_allocated'] / GIB:6.2f} GiB, reserved "
                      f"{pred['total'] / GIB:6.2f} (params {pred['params'] / GIB:.2f}, grads {pred['grads'] / GIB:.2f}, "
                      f"states {pred['optimizer_states'] / GIB:.2f}, buffers {pred['buffers'] / GIB:.2f}, "
                      f"workspace {pred['workspace'] / GIB:.2f}, cache {pred['allocator_reserve'] / GIB:.2f})")
            print(f"   measured:  peak allocated {rep['max_memory_allocated_bytes'] / GIB:6.2f} GiB, reserved "
                  f"{rep['max_memory_reserved_bytes'] / GIB:6.2f}; before the first step allocated "
                  f"{rep['base_allocated_bytes'] / GIB:.2f}, reserved {rep['base_reserved_bytes'] / GIB:.2f}")
            for name in ("at_peak_allocated", "at_peak_reserved"):
                p = rep[name]
                print(f"   {name}: allocated {p['allocated_bytes'] / GIB:.2f} GiB (before the step "
                      f"{p['allocated_before_step_bytes'] / GIB:.2f}, in it {p['allocated_in_step_bytes'] / GIB:.2f} in "
                      f"{p['live_in_step_blocks']} blocks), reserved {p['reserved_bytes'] / GIB:.2f}; new segments "
                      f"{p['segments_new']} = {p['segments_new_bytes'] / GIB:.2f} GiB, free in them "
                      f"{p['segments_new_free_bytes'] / GIB:.2f}")
                for row in p["by_owner"][:top]:
                    print(f"      {row['bytes'] / GIB:7.3f} GiB  {row['where']}")
                if name == "at_peak_allocated":
                    print("     by operation:")
                    for row in p["by_operation"][:top]:
                        print(f"      {row['bytes'] / GIB:7.3f} GiB  {row['where']}")
                else:
                    print("     largest new segments (GiB size / free, created by):")
                    for seg in p["largest_new_segments"][:top]:
                        print(f"      {seg['bytes'] / GIB:7.2f} / {seg['free_bytes'] / GIB:6.2f}  {seg.get('created_by', '(not recorded)')}")
            print()


if __name__ == "__main__":
    main()
