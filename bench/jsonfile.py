"""A benchmark's JSON file, plain or gzipped (docs/perf keeps its larger raw files as .json.gz)."""

import gzip
import json


def load(path):
    with (gzip.open if str(path).endswith(".gz") else open)(path, "rt") as f:
        return json.load(f)
