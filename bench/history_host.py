"""The history drafter's host time per cycle (docs/perf/history.md): `continuation` for a chain (count 1) and for a
tree's candidates (count 6), on a synthetic store of 60 answers of three templates with three slots each, a row 20
tokens into a stored answer. No model: on a GPU, where a cycle of a small target takes milliseconds, this is the
part of a cycle the history adds.   python bench/history_host.py"""

import time
from types import SimpleNamespace

import numpy as np

from mtpcli.drafters import history as H


def main(n: int = 300) -> None:
    rng = np.random.default_rng(0)
    templates = [rng.integers(100, 5000, 48) for _ in range(3)]
    docs = []
    for i in range(60):
        out = templates[i % 3].copy()
        out[[5, 17, 30]] = rng.integers(100, 5000, 3)
        docs.append(SimpleNamespace(prompt=rng.integers(100, 5000, 40), output=out))
    corpus, own = H.Corpus(docs), H.Own(list(docs[3].prompt))
    own.sync(list(docs[3].prompt) + list(docs[3].output[:20]))
    q = own.tokens
    found = lambda: [(corpus.tokens, corpus.occurrences(q)), (own.tokens, own.occurrences(q))]  # noqa: E731
    for name, f in [("search", found), ("chain (count 1)", lambda: H.continuation(found(), q, 16, 1)),
                    ("tree candidates (count 6)", lambda: H.continuation(found(), q, 16, 6))]:
        f()
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        print(f"{name:28s} {(time.perf_counter() - t0) / n * 1e6:7.0f} us")


if __name__ == "__main__":
    main()
