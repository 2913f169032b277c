"""A pure-Python BM25 index: WebShop's search engine without Java.

The original indexes each product's title, description, first bullet point and option
values with Lucene (pyserini, BM25 k1=0.9, b=0.4, English analyzer) and returns the top
50 hits. We score the same text with the same formula and parameters. Differences: our
analyzer lower-cases, splits on non-alphanumerics, drops Lucene's English stopwords and
strips plural endings (a light "s-stemmer", not Porter), and document lengths are exact
rather than Lucene's one-byte approximation; so scores, and the order of near-ties,
can differ from Lucene's. Exact ties go to the earlier document: rankings are
deterministic.

Postings are compact ``array`` columns (8 bytes per distinct term of a document, about
2 GB for the full 1.2M-product catalog). Building is pure Python, a few thousand
documents a second on one core, so the full catalog takes several minutes: a catalog
builds its index once per process, on first search or in ``suite.prepare``.
"""

from __future__ import annotations

import functools
import heapq
import math
import re
from array import array
from collections import Counter
from collections.abc import Iterable

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
        self._postings: dict[str, tuple[array, array]] = {}
        self._lengths = array("I")
        for doc_id, text in enumerate(docs):
            counts = Counter(tokenize(text))
            self._lengths.append(sum(counts.values()))
            for term, tf in counts.items():
                ids, tfs = self._postings.setdefault(term, (array("I"), array("I")))
                ids.append(doc_id)
                tfs.append(tf)
        n = len(self._lengths)
        self._avg_len = (sum(self._lengths) / n) if n else 0.0

    def __len__(self) -> int:
        return len(self._lengths)

    def idf(self, term: str) -> float:
        df = len(self._postings[term][0]) if term in self._postings else 0
        return math.log(1 + (len(self) - df + 0.5) / (df + 0.5))

    def scores(self, query: str) -> dict[int, float]:
        """BM25 score of every document sharing a term with ``query`` (repeated query
        terms count again, as in a Lucene boolean query)."""
        out: dict[int, float] = {}
        k1, b, avg, lengths = self.k1, self.b, self._avg_len or 1.0, self._lengths
        for term, q_tf in Counter(tokenize(query)).items():
            if term not in self._postings:
                continue
            ids, tfs = self._postings[term]
            w = q_tf * self.idf(term) * (k1 + 1)
            for doc, tf in zip(ids, tfs):
                norm = k1 * (1 - b + b * lengths[doc] / avg)
                out[doc] = out.get(doc, 0.0) + w * tf / (tf + norm)
        return out

    def search(self, query: str, k: int = 50) -> list[int]:
        """The ``k`` best documents, best first; ties go to the lower document index."""
        scored = self.scores(query)
        return [doc for doc, _ in heapq.nsmallest(k, scored.items(), key=lambda x: (-x[1], x[0]))]
