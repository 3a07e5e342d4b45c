"""Reading train's JSONL run records for the bench tables: the measured (non-warm-up) steps."""
import json


def measured_steps(path):
    """Yields each record of `path` that is not a warm-up step (blank lines skipped)."""
    for line in open(path):
        line = line.strip()
        if not line:
            continue
        r = json.loads(line)
        if not r.get("warmup"):
            yield r
