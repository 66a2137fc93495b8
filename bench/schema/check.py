"""Validity of each arm's answers: python bench/schema/check.py OUT spec plain free (run.sh's OUT folder)."""

import json
import sys
from pathlib import Path

import jsonschema

rows = [json.loads(line) for line in (Path(__file__).parent / "schema.jsonl").open()]
schemas = {r["id"]: r["schema"] for r in rows}
for arm in sys.argv[2:]:
    ok = n = 0
    for line in open(f"{sys.argv[1]}/{arm}.out"):
        r = json.loads(line)
        n += 1
        try:
            jsonschema.validate(json.loads(r["text"]), schemas[r["id"]])
            ok += 1
        except (ValueError, jsonschema.ValidationError) as e:
            print(arm, r["id"], "INVALID", type(e).__name__, repr(r["text"][:120]))
    print(arm, f"{ok}/{n} valid")
