"""Reading the JSONL run records for the bench tables: every record, or the measured (non-warm-up) steps."""
import json


def records(path):
    """Yields each record of `path`, step or micro-benchmark (blank lines skipped)."""
    for line in open(path):
        line = line.strip()
        if line:
            yield json.loads(line)


def measured_steps(path):
    """Yields each record of `path` that is not a warm-up step (blank lines skipped)."""
    for r in records(path):
        if not r.get("warmup"):
            yield r
