"""A pure-Python BM25 index: WebShop's search engine without Java.

The original indexes each product's title, description, first bullet point and option
values with Lucene (pyserini, BM25 k1=0.9, b=0.4, English analyzer) and returns the top
50 hits. We score the same text with the same formula and parameters. Differences: our
analyzer lower-cases, splits on non-alphanumerics, drops Lucene's English stopwords and
strips plural endings (a light "s-stemmer", not Porter), and document lengths are exact
rather than Lucene's one-byte approximation; so scores, and the order of near-ties,
can differ from Lucene's. Exact ties go to the earlier document: rankings are
deterministic.

Postings are one compressed-sparse-row block of numpy columns (document ids and term
frequencies, 8 bytes per distinct term of a document); a query is scored with vectorized
float64 arithmetic in the same order of operations as ``reference_scores``, the
plain-Python formula kept as the readable spec, so both give bit-identical scores. A
catalog builds its index once per process, on first search or in ``suite.prepare``.
Its build time, memory and search speed at the full catalog's size, against the plain-Python
loop with the same top 50: docs/benchmarks.md (``bench/webshop_index.py``).
"""

from __future__ import annotations

import functools
import heapq
import math
import re
from array import array
from collections import Counter
from collections.abc import Iterable

import numpy as np

# Lucene's default English stop set (what pyserini's analyzer removes).
STOPWORDS = frozenset("""
a an and are as at be but by for if in into is it no not of on or such that the their
then there these they this to was will with
""".split())
_TOKEN = re.compile(r"[a-z0-9]+")


@functools.lru_cache(maxsize=1 << 20)
def _stem(word: str) -> str:
    """Harman's s-stemmer: "batteries" -> "battery", "shoes" -> "shoe", "glass" stays."""
    if len(word) > 3 and word.endswith("ies") and not word.endswith(("eies", "aies")):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("es") and not word.endswith(("aes", "ees", "oes")):
        return word[:-1]
    if len(word) > 2 and word.endswith("s") and not word.endswith(("us", "ss")):
        return word[:-1]
    return word


def tokenize(text: str) -> list[str]:
    return [_stem(t) for t in _TOKEN.findall(text.lower()) if t not in STOPWORDS]


class BM25Index:
    """Okapi BM25 over a fixed list of documents; ``search`` returns document indices."""

    def __init__(self, docs: Iterable[str], k1: float = 0.9, b: float = 0.4) -> None:
        self.k1, self.b = k1, b
        postings: dict[str, tuple[array, array]] = {}
        lengths = array("I")
        for doc_id, text in enumerate(docs):
            counts = Counter(tokenize(text))
            lengths.append(sum(counts.values()))
            for term, tf in counts.items():
                ids, tfs = postings.setdefault(term, (array("I"), array("I")))
                ids.append(doc_id)
                tfs.append(tf)
        # one CSR block: term -> row, row r's postings are _ids/_tfs[_start[r]:_start[r + 1]]
        self._row = {term: r for r, term in enumerate(postings)}
        sizes = np.fromiter((len(ids) for ids, _ in postings.values()), dtype=np.int64, count=len(postings))
        self._start = np.zeros(len(postings) + 1, dtype=np.int64)
        np.cumsum(sizes, out=self._start[1:])
        self._ids = np.empty(int(self._start[-1]), dtype=np.uint32)
        self._tfs = np.empty(int(self._start[-1]), dtype=np.uint32)
        for r, (ids, tfs) in enumerate(postings.values()):
            self._ids[self._start[r]:self._start[r + 1]] = np.frombuffer(ids, dtype=np.uint32)
            self._tfs[self._start[r]:self._start[r + 1]] = np.frombuffer(tfs, dtype=np.uint32)
        del postings
        self._lengths = np.frombuffer(lengths, dtype=np.uint32).astype(np.float64)
        n = len(self._lengths)
        self._avg_len = float(sum(lengths)) / n if n else 0.0

    def __len__(self) -> int:
        return len(self._lengths)

    @property
    def total_terms(self) -> int:
        """Indexed words over all documents (after stopwords)."""
        return int(self._lengths.sum())

    def df(self, term: str) -> int:
        r = self._row.get(term)
        return 0 if r is None else int(self._start[r + 1] - self._start[r])

    def idf(self, term: str) -> float:
        df = self.df(term)
        return math.log(1 + (len(self) - df + 0.5) / (df + 0.5))

    def postings(self, term: str) -> tuple[np.ndarray, np.ndarray]:
        """(document ids, term frequencies) of ``term``; empty when unseen."""
        r = self._row.get(term)
        if r is None:
            return self._ids[:0], self._tfs[:0]
        return self._ids[self._start[r]:self._start[r + 1]], self._tfs[self._start[r]:self._start[r + 1]]

    def _score_vector(self, query: str) -> tuple[np.ndarray, np.ndarray]:
        """(matching document ids, their scores). Per term, the same float64 operations in
        the same order as ``reference_scores``; per document, terms are added in query
        order starting from 0.0, as there. Every term's contribution is > 0 (idf > 0,
        tf > 0), so the matching documents are exactly those with a nonzero score."""
        k1, b, avg = self.k1, self.b, self._avg_len or 1.0
        scores = np.zeros(len(self), dtype=np.float64)
        for term, q_tf in Counter(tokenize(query)).items():
            ids, tfs = self.postings(term)
            if not len(ids):
                continue
            w = q_tf * self.idf(term) * (k1 + 1)
            norm = k1 * (1 - b + b * self._lengths[ids] / avg)
            scores[ids] += w * tfs / (tfs + norm)  # a term's postings hold each document once
        docs = np.flatnonzero(scores)
        return docs, scores[docs]

    def scores(self, query: str) -> dict[int, float]:
        """BM25 score of every document sharing a term with ``query`` (repeated query
        terms count again, as in a Lucene boolean query)."""
        docs, vals = self._score_vector(query)
        return dict(zip(docs.tolist(), vals.tolist()))

    def search(self, query: str, k: int = 50) -> list[int]:
        """The ``k`` best documents, best first; ties go to the lower document index."""
        docs, vals = self._score_vector(query)
        if len(docs) > k:  # keep every document scoring at least the k-th score (ties included)
            kth = np.partition(vals, len(vals) - k)[len(vals) - k]
            keep = vals >= kth
            docs, vals = docs[keep], vals[keep]
        order = np.lexsort((docs, -vals))  # by score descending, then document index
        return docs[order][:k].tolist()


def reference_scores(index: BM25Index, query: str) -> dict[int, float]:
    """The plain-Python BM25 loop the vectorized scorer must equal, bit for bit (tests and
    ``bench/webshop_index.py`` compare them)."""
    out: dict[int, float] = {}
    k1, b, avg = index.k1, index.b, index._avg_len or 1.0
    for term, q_tf in Counter(tokenize(query)).items():
        ids, tfs = index.postings(term)
        w = q_tf * index.idf(term) * (k1 + 1)
        for doc, tf in zip(ids.tolist(), tfs.tolist()):
            norm = k1 * (1 - b + b * float(index._lengths[doc]) / avg)
            out[doc] = out.get(doc, 0.0) + w * tf / (tf + norm)
    return out


def reference_search(index: BM25Index, query: str, k: int = 50) -> list[int]:
    scored = reference_scores(index, query)
    return [doc for doc, _ in heapq.nsmallest(k, scored.items(), key=lambda x: (-x[1], x[0]))]
