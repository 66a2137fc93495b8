"""Validity of each arm's answers: python bench/schema/check.py OUT spec plain free (run.sh's OUT folder)."""
import json, sys
schemas = {json.loads(l)["id"]: json.loads(l)["schema"] for l in open(__file__.rsplit("/", 1)[0] + "/schema.jsonl")}
try:
    import jsonschema
except ImportError:
    jsonschema = None
for arm in sys.argv[2:]:
    ok = n = 0
    for l in open(f"{sys.argv[1]}/{arm}.out"):
        r = json.loads(l); n += 1
        try:
            v = json.loads(r["text"])
            if jsonschema: jsonschema.validate(v, schemas[r["id"]])
            ok += 1
        except Exception as e:
            print(arm, r["id"], "INVALID", type(e).__name__, repr(r["text"][:120]))
    print(arm, f"{ok}/{n} valid", "(schema-checked)" if jsonschema else "(parsed)")
