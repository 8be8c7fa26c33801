#!/usr/bin/env python3
# The summaries of induction_heads and grokking hold exactly the fields docs/experiments.md
# documents: runs each program briefly, reads the field table under "### `PROGRAM --summary`" (the
# backticked names of each row's first cell) and compares it with the summary's top-level keys,
# naming every field missing on either side. Its negative controls: the same comparison with one
# documented row left out, and with a key added to the summary, must each find exactly that field.
#
#   check_summary_fields.py INDUCTION_HEADS GROKKING DOC WORK_DIR
import json
import os
import re
import subprocess
import sys

RUNS = {
    "induction_heads": ["--steps", "4", "--eval-interval", "2", "--test-sequences", "8", "--quiet"],
    "grokking": ["--p", "11", "--steps", "4", "--eval-interval", "2", "--snapshot-interval", "2", "--quiet"],
}


def documented_fields(doc_text, program):
    """The backticked names in the first cell of each row of the table under the program's heading."""
    heading = "### `%s --summary`" % program
    at = doc_text.find(heading)
    if at < 0:
        raise SystemExit("%s: no heading %r" % ("docs", heading))
    fields = []
    for line in doc_text[at + len(heading):].splitlines():
        if line.startswith("#"):
            break
        if not line.startswith("| `"):
            continue
        first_cell = line.split("|")[1]
        fields += re.findall(r"`([a-z_]+)`", first_cell)
    return fields


def differences(documented, keys):
    """Lines naming the fields only one side has."""
    out = ["undocumented field: %s" % k for k in sorted(set(keys) - set(documented))]
    out += ["documented but not in the summary: %s" % k for k in sorted(set(documented) - set(keys))]
    out += ["documented twice: %s" % k for k in sorted({k for k in documented if documented.count(k) > 1})]
    return out


def main():
    induction, grokking, doc, work = sys.argv[1:5]
    os.makedirs(work, exist_ok=True)
    with open(doc) as f:
        doc_text = f.read()
    failures = []
    for program, binary in (("induction_heads", induction), ("grokking", grokking)):
        summary = os.path.join(work, program + ".json")
        run = subprocess.run([binary, *RUNS[program], "--summary", summary], capture_output=True, text=True)
        if run.returncode != 0:
            failures.append("%s failed (%d): %s" % (program, run.returncode, run.stderr.strip()))
            continue
        with open(summary) as f:
            keys = list(json.load(f))
        documented = documented_fields(doc_text, program)
        found = differences(documented, keys)
        failures += ["%s: %s" % (program, line) for line in found]
        print("%s: %d fields in the summary, %d documented" % (program, len(keys), len(documented)))
        # Negative controls: one documented field left out, one summary key added.
        left_out = documented[len(documented) // 2]
        if differences([d for d in documented if d != left_out], keys) != ["undocumented field: %s" % left_out]:
            failures.append("%s: leaving %s out of the table was not found" % (program, left_out))
        if differences(documented, keys + ["not_a_field"]) != ["undocumented field: not_a_field"]:
            failures.append("%s: an extra summary key was not found" % program)
    for line in failures:
        print(line, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
