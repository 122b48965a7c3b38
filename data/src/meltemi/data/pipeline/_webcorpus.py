"""A web-like corpus to measure fuzzy dedup honestly (tests, `//data:bench`); no download.

Text is real English prose: the docstrings of the Python standard library on this machine,
cut into non-overlapping runs of sentences, so no two pages share a body. Pages belong to
sites, and the pages of one site share its boilerplate as real web pages do: a header and
navigation bar, a cookie banner and a licence (a few texts shared across sites), and a footer.
Near-duplicate copies are planted with a measured Jaccard similarity (on the 5-word shingles
the dedup uses, `shingles`) in each of `BUCKETS`: a copy is its page with scattered word edits
(substitutions, insertions, deletions) or a block edit (a paragraph replaced), applied until
the similarity falls in the bucket. Ground truth is the measured similarity, never the way a
document was made: `dedup_quality` counts a merge of two documents as right when their true
Jaccard similarity is at least the threshold.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import sysconfig
from math import comb

import numpy as np

from meltemi.data.pipeline._minhash import (
    connected_components,
    lsh_params,
    minhash_signatures,
    near_duplicate_components,
)
from meltemi.data.pipeline._synthetic import JUNK_KINDS, junk_text

__all__ = [
    "BUCKETS",
    "WebCorpus",
    "compare_dedups",
    "datasketch_components",
    "dedup_quality",
    "drop_probability",
    "jaccard",
    "s_curve",
    "shingles",
    "site_pair_jaccard",
    "web_corpus",
]

BUCKETS = ((0.75, 0.80), (0.80, 0.85), (0.85, 0.90), (0.90, 0.95))
# Words as the dedup splits them: runs of characters that are not ASCII whitespace or
# punctuation (`_minhash._SEPARATOR`), lowercased.
_WORD = re.compile(r"[^\x00-\x2f\x3a-\x40\x5b-\x60\x7b-\x7f]+")
_DOCSTRING = re.compile(r'"""(.*?)"""', re.S)
_SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "lib2to3", "__pycache__", "turtledemo"}


def shingles(text: str, size: int = 5) -> set[tuple[str, ...]]:
    """The set of `size`-word shingles of `text`, words split as the dedup splits them."""
    w = _WORD.findall(text.lower())
    return {tuple(w[i : i + size]) for i in range(len(w) - size + 1)}


def jaccard(a: set, b: set) -> float:
    """Jaccard similarity of two sets (0 when both are empty)."""
    return len(a & b) / len(a | b) if a or b else 0.0


@functools.lru_cache(maxsize=1)
def _sentences() -> tuple[str, ...]:
    """Distinct prose sentences of the standard library's docstrings, in a fixed order."""
    root = sysconfig.get_paths()["stdlib"]
    files = []
    for d, dirs, names in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in _SKIP_DIRS)
        files += [os.path.join(d, f) for f in sorted(names) if f.endswith(".py")]
    seen, out = set(), []
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            source = f.read()
        for m in _DOCSTRING.finditer(source):
            for para in re.split(r"\n\s*\n", m.group(1)):
                words = para.split()
                if len(words) < 8 or ">>>" in para or "::" in para:
                    continue  # code, doctests, grammar: not prose
                if sum(any(c.isalpha() for c in w) for w in words) < 0.9 * len(words):
                    continue
                for sentence in re.split(r"(?<=[.!?])\s+", " ".join(words)):
                    if len(sentence.split()) >= 5 and sentence not in seen:
                        seen.add(sentence)
                        out.append(sentence)
    return tuple(out)


_NAV = [
    "Home", "Docs", "Blog", "Pricing", "About us", "Contact", "Sign in", "Register", "Forum",
    "Downloads", "Support", "Community", "News", "Events", "Careers", "Shop", "FAQ", "Search",
]  # fmt: skip
_COOKIES = [
    "We use cookies to improve your experience on our website. By continuing to browse this "
    "site you agree to our use of cookies. Read our cookie policy to learn more about how we "
    "use cookies and how you can manage them. Accept all cookies Reject non-essential cookies "
    "Cookie settings",
    "This website uses cookies and similar technologies to analyse traffic, personalise content "
    "and ads, and provide social media features. You can change your preferences at any time "
    "in the privacy settings. Accept Decline Manage preferences",
    "Cookies help us deliver our services. By using our services, you agree to our use of "
    "cookies. Learn more Got it",
]
_LICENCES = [
    "Except where otherwise noted, content on this site is licensed under a Creative Commons "
    "Attribution-ShareAlike 4.0 International License. You are free to share and adapt the "
    "material for any purpose, even commercially, as long as you give appropriate credit, "
    "provide a link to the license, and indicate if changes were made. If you remix, "
    "transform, or build upon the material, you must distribute your contributions under the "
    "same license as the original.",
    "Permission is hereby granted, free of charge, to any person obtaining a copy of this "
    "software and associated documentation files, to deal in the Software without "
    "restriction, including without limitation the rights to use, copy, modify, merge, "
    "publish, distribute, sublicense, and/or sell copies of the Software, subject to the "
    "following conditions: The above copyright notice and this permission notice shall be "
    "included in all copies or substantial portions of the Software. THE SOFTWARE IS PROVIDED "
    "AS IS, WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED.",
    "All rights reserved. No part of this publication may be reproduced, distributed, or "
    "transmitted in any form or by any means without the prior written permission of the "
    "publisher, except in the case of brief quotations embodied in critical reviews.",
]
_FOOTER = [
    "Privacy policy", "Terms of use", "Accessibility", "Sitemap", "Press", "Advertise",
    "Status", "Security", "Help centre", "Newsletter", "Follow us on social media",
]  # fmt: skip
_SECTIONS = ["Guides", "Reference", "Tutorials", "Articles", "Answers", "Notes", "Library"]


def _site(rng: np.random.Generator, k: int) -> tuple[list[str], list[str]]:
    """(lines above the body, lines below it) of site `k`'s pages."""
    name = f"site{k}"
    nav = "   ".join(rng.choice(_NAV, int(rng.integers(6, 14)), replace=False))
    top = [f"{name.capitalize()} - the {_SECTIONS[k % len(_SECTIONS)].lower()} people read", nav]
    if rng.random() < 0.7:
        top.append(str(rng.choice(_COOKIES)))
    bottom = []
    if rng.random() < 0.6:
        bottom.append(str(rng.choice(_LICENCES)))
    links = "   ".join(rng.choice(_FOOTER, int(rng.integers(4, 10)), replace=False))
    bottom += [links, f"Copyright 2026 {name}. All rights reserved."]
    return top, bottom


def _render(top: list[str], body: list[str], bottom: list[str], crumb: str) -> str:
    lines = [" ".join(body[i : i + 14]) for i in range(0, len(body), 14)]
    return "\n".join([*top, crumb, "", *lines, "", *bottom])


def _edited(rng, body: list[str], vocab: list[str], k: int, block: bool) -> list[str]:
    """`body` with `k` edits: scattered word edits, or one block of `k` words replaced."""
    out = list(body)
    if block:
        at = int(rng.integers(0, max(1, len(out) - k)))
        out[at : at + k] = [vocab[int(i)] for i in rng.integers(0, len(vocab), k)]
        return out
    for _ in range(k):
        at = int(rng.integers(0, len(out)))
        op = rng.random()
        if op < 0.6:
            out[at] = vocab[int(rng.integers(len(vocab)))]
        elif op < 0.8 and len(out) > 10:
            del out[at]
        else:
            out.insert(at, vocab[int(rng.integers(len(vocab)))])
    return out


@dataclasses.dataclass(frozen=True)
class WebCorpus:
    """Documents and their ground truth.

    Attributes:
        texts: the documents, in input order.
        kind: `page` (a distinct page), `near` (a planted copy) or `exact` (a copy with its
            whitespace changed); `junk:<kind>` for junk.
        group: the page a copy was made from (its own index for a page, -1 for junk).
        site: the site whose boilerplate the document carries (-1 for junk).
        pairs: int [n, 2], (page, near copy) of each planted pair.
        pair_jaccard: true Jaccard similarity of each planted pair on `shingle_size` shingles.
        shingle_size: words per shingle.
    """

    texts: list[str]
    kind: list[str]
    group: list[int]
    site: list[int]
    pairs: np.ndarray
    pair_jaccard: np.ndarray
    shingle_size: int


def web_corpus(
    pages: int,
    *,
    pairs_per_bucket: int,
    sites: int = 12,
    exact: int = 0,
    junk: int = 0,
    min_words: int = 30,
    max_words: int = 400,
    shingle_size: int = 5,
    seed: int = 0,
) -> WebCorpus:
    """A shuffled corpus of `pages` distinct pages on `sites` sites, plus copies and junk.

    Args:
        pages: distinct pages (bodies of `min_words..max_words` words, log-uniform).
        pairs_per_bucket: near copies planted in each of `BUCKETS` (of distinct pages).
        sites: sites; a page carries its site's boilerplate.
        exact: exact copies (whitespace changed) of random pages.
        junk: junk documents (`_synthetic`'s kinds, in turn).
        min_words, max_words: body length range, in words.
        shingle_size: words per shingle of the measured similarities.
        seed: fixes everything.
    """
    rng = np.random.default_rng(seed)
    sentences = _sentences()
    vocab = sorted({w for s in sentences[::7] for w in s.split()})
    layout = [_site(rng, k) for k in range(sites)]
    texts, kind, group, site, bodies = [], [], [], [], []
    start = cursor = int(rng.integers(len(sentences)))
    for i in range(pages):
        want = int(np.exp(rng.uniform(np.log(min_words), np.log(max_words))))
        body: list[str] = []
        while len(body) < want:  # consecutive sentences: each page its own run of text
            body += sentences[cursor % len(sentences)].split()
            cursor += 1
        s = int(rng.integers(sites))
        crumb = f"Home > {_SECTIONS[int(rng.integers(len(_SECTIONS)))]} > Page {i}"
        bodies.append((body, crumb))
        texts.append(_render(layout[s][0], body, layout[s][1], crumb))
        kind.append("page")
        group.append(i)
        site.append(s)
    if cursor - start > len(sentences):
        words = sum(len(x.split()) for x in sentences)
        raise ValueError(
            f"web_corpus(pages={pages}, max_words={max_words}): the bodies need more than the "
            f"{words:,} words of prose in this Python's standard library; use fewer pages or a "
            "smaller max_words"
        )
    pairs, pair_j = [], []
    order = rng.permutation(pages)  # each page copied once while there are pages left
    used = 0
    for lo, hi in BUCKETS:
        planted, tries = 0, 0
        while planted < pairs_per_bucket:
            tries += 1
            if tries > 20 * pairs_per_bucket:
                raise ValueError(f"web_corpus: cannot plant copies of Jaccard in [{lo}, {hi})")
            g = int(order[used % pages])
            used += 1
            target = rng.uniform(lo, hi)
            block = bool(rng.random() < 0.3)
            made = _copy_at(rng, texts[g], bodies[g], layout[site[g]], vocab, target, block,
                            shingle_size)  # fmt: skip
            if made is None or not lo <= made[1] < hi:
                continue
            pairs.append((g, len(texts)))
            pair_j.append(made[1])
            texts.append(made[0])
            kind.append("near")
            group.append(g)
            site.append(site[g])
            planted += 1
    for _ in range(exact):
        g = int(rng.integers(pages))
        texts.append(texts[g].replace(". ", ".  ").replace("\n", "\r\n"))
        kind.append("exact")
        group.append(g)
        site.append(site[g])
    junk_vocab = np.asarray(vocab)
    for j in range(junk):
        k = JUNK_KINDS[j % len(JUNK_KINDS)]
        texts.append(junk_text(rng, junk_vocab, k))
        kind.append(f"junk:{k}")
        group.append(-1)
        site.append(-1)
    perm = rng.permutation(len(texts))
    where = np.empty_like(perm)
    where[perm] = np.arange(len(perm))
    remap = lambda g: int(where[g]) if g >= 0 else -1  # noqa: E731
    return WebCorpus(
        texts=[texts[i] for i in perm],
        kind=[kind[i] for i in perm],
        group=[remap(group[i]) for i in perm],
        site=[site[i] for i in perm],
        pairs=where[np.asarray(pairs, np.int64).reshape(-1, 2)],
        pair_jaccard=np.asarray(pair_j),
        shingle_size=shingle_size,
    )


def _copy_at(rng, text, page, layout, vocab, target, block, size):
    """(copy, its true Jaccard with `text`) with the similarity nearest `target`, or None."""
    body, crumb = page
    base = shingles(text, size)
    seed = int(rng.integers(1 << 62))
    lo, hi = 1, len(body)
    best = None
    while lo <= hi:  # similarity falls (about monotonically) with the number of edits
        k = (lo + hi) // 2
        edited = _edited(np.random.default_rng(seed), body, vocab, k, block)
        copy = _render(layout[0], edited, layout[1], crumb)
        j = jaccard(base, shingles(copy, size))
        if best is None or abs(j - target) < abs(best[1] - target):
            best = (copy, j)
        if j > target:
            lo = k + 1
        else:
            hi = k - 1
    return best


def s_curve(s: float | np.ndarray, bands: int, rows: int) -> np.ndarray:
    """LSH candidate probability `1 - (1 - s**rows)**bands` at Jaccard similarity `s`."""
    return 1 - (1 - np.asarray(s, float) ** rows) ** bands


def drop_probability(s: float, bands: int, rows: int, num_perm: int, threshold: float) -> float:
    """Probability that a pair of Jaccard similarity `s` is merged: a candidate (some band
    agrees in all its rows) whose signatures agree in at least `threshold` of the `num_perm`
    values, each value agreeing independently with probability `s` (exact, by convolution)."""

    def binom(n: int) -> np.ndarray:
        return np.array([comb(n, k) * s**k * (1 - s) ** (n - k) for k in range(n + 1)])

    band = binom(rows)
    # dist[c, k]: probability of k agreements so far with c = whether some band was full.
    dist = np.zeros((2, num_perm + 1))
    dist[0, 0] = 1.0
    for _ in range(bands):
        new = np.zeros_like(dist)
        for k in range(rows + 1):
            full = 1 if k == rows else 0
            shifted = np.roll(dist, k, axis=1) * band[k]
            shifted[:, :k] = 0
            new[full] += shifted[0]
            new[1] += shifted[1]
        dist = new
    rest = binom(num_perm - bands * rows)
    total = np.convolve(dist[1], rest)[: num_perm + 1]
    need = int(np.ceil(threshold * num_perm - 1e-9))
    return float(total[need:].sum())


def dedup_quality(
    corpus: WebCorpus, labels: np.ndarray, threshold: float, *, lsh: tuple[int, int, int]
) -> dict:
    """Recall per Jaccard bucket (with the theory beside it) and false positives of a dedup.

    Args:
        corpus: the corpus the dedup ran on.
        labels: component label of each document (equal labels: merged, one is kept).
        threshold: the dedup's Jaccard threshold; a merge is right when the true
            similarity of the two documents is at least this.
        lsh: (bands, rows, num_perm) of the dedup, for the theory columns.
    """
    bands, rows, num_perm = lsh
    i, j = corpus.pairs[:, 0], corpus.pairs[:, 1]
    hit = labels[i] == labels[j]
    out: dict = {"buckets": []}
    for lo, hi in BUCKETS:
        sel = (corpus.pair_jaccard >= lo) & (corpus.pair_jaccard < hi)
        js = corpus.pair_jaccard[sel]
        out["buckets"].append({
            "jaccard": f"{lo:.2f}-{hi:.2f}",
            "pairs": int(sel.sum()),
            "recall": float(hit[sel].mean()),
            "s_curve": float(s_curve(js, bands, rows).mean()),
            "theory": float(np.mean([drop_probability(x, bands, rows, num_perm, threshold)
                                     for x in js])),
        })  # fmt: skip
    above = corpus.pair_jaccard >= threshold
    out["recall"] = float(hit[above].mean())
    # Every merged pair of documents, judged by its true similarity.
    members: dict[int, list[int]] = {}
    for d, lab in enumerate(labels.tolist()):
        members.setdefault(lab, []).append(d)
    sets = {}
    right = wrong = 0
    wrong_docs = set()
    for docs in members.values():
        if len(docs) < 2:
            continue
        for a in range(len(docs)):
            for b in range(a + 1, len(docs)):
                x, y = docs[a], docs[b]
                kinds = {corpus.kind[x], corpus.kind[y]}
                if corpus.group[x] == corpus.group[y] and "exact" in kinds:
                    continue  # an exact copy: exact dedup's business, not this measure's
                for d in (x, y):
                    if d not in sets:
                        sets[d] = shingles(corpus.texts[d], corpus.shingle_size)
                if jaccard(sets[x], sets[y]) >= threshold:
                    right += 1
                else:
                    wrong += 1
                    wrong_docs.update((x, y))
    out["merged_pairs"] = right + wrong
    out["precision"] = right / (right + wrong) if right + wrong else 1.0
    in_pair = set(corpus.pairs.ravel().tolist())
    single = [d for d, k in enumerate(corpus.kind) if k == "page" and d not in in_pair]
    out["false_positive_rate"] = sum(d in wrong_docs for d in single) / max(1, len(single))
    out["single_pages"] = len(single)
    return out


def site_pair_jaccard(corpus: WebCorpus, limit: int = 4000, seed: int = 0) -> np.ndarray:
    """True Jaccard similarities of up to `limit` random pairs of distinct pages of one site
    (how much their shared boilerplate makes them alike)."""
    rng = np.random.default_rng(seed)
    in_pair = set(corpus.pairs.ravel().tolist())
    by_site: dict[int, list[int]] = {}
    for d, k in enumerate(corpus.kind):
        if k == "page" and d not in in_pair:
            by_site.setdefault(corpus.site[d], []).append(d)
    groups = [v for v in by_site.values() if len(v) > 1]
    out = []
    for _ in range(limit):
        docs = groups[int(rng.integers(len(groups)))]
        a, b = rng.choice(len(docs), 2, replace=False)
        out.append(jaccard(shingles(corpus.texts[docs[a]], corpus.shingle_size),
                           shingles(corpus.texts[docs[b]], corpus.shingle_size)))  # fmt: skip
    return np.asarray(out)


def datasketch_components(
    texts: list[str],
    *,
    threshold: float,
    num_perm: int,
    shingle_size: int = 5,
    params: tuple[int, int] | None = None,
    seed: int = 1,
) -> tuple[np.ndarray, tuple[int, int]]:
    """The reference dedup: datasketch's `MinHash` (the same shingles) and `MinHashLSH` (its
    own bands for `threshold` and `num_perm`, or `params` = (bands, rows)), each candidate
    kept when `MinHash.jaccard` reaches `threshold`, as its users do; components of the kept
    pairs, as ours.

    Returns (component label of each text, (bands, rows) of the index).
    """
    from datasketch import MinHash, MinHashLSH  # a test and bench dependency, not the wheel's

    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm, params=params)
    sigs = []
    for i, t in enumerate(texts):
        m = MinHash(num_perm=num_perm, seed=seed)
        sh = shingles(t, shingle_size)
        if sh:
            m.update_batch([" ".join(s).encode() for s in sh])
            lsh.insert(i, m)
        sigs.append(m if sh else None)
    pi, pj = [], []
    for i, m in enumerate(sigs):
        if m is None:
            continue
        for j in lsh.query(m):
            if j > i and m.jaccard(sigs[j]) >= threshold:
                pi.append(i)
                pj.append(j)
    label = connected_components(len(texts), np.asarray(pi, np.int64), np.asarray(pj, np.int64))
    return label, (int(lsh.b), int(lsh.r))


def compare_dedups(corpus: WebCorpus, *, threshold: float = 0.8, num_perm: int = 128) -> dict:
    """`dedup_quality` (plus `bands`, `rows`) of ours (`minhash_signatures` +
    `near_duplicate_components`, the pipeline's bands), of datasketch with its own bands
    (`datasketch`) and of datasketch with our bands (`datasketch_same_bands`), on the same
    documents."""
    bands, rows = lsh_params(threshold, num_perm)
    size = corpus.shingle_size
    sig, has = minhash_signatures(corpus.texts, num_perm=num_perm, shingle_size=size)
    label, _ = near_duplicate_components(sig, has, threshold=threshold, bands=bands, rows=rows)
    labels = {"ours": (label, (bands, rows))}
    for name, params in (("datasketch", None), ("datasketch_same_bands", (bands, rows))):
        labels[name] = datasketch_components(
            corpus.texts, threshold=threshold, num_perm=num_perm, shingle_size=size, params=params
        )
    return {
        name: dedup_quality(corpus, lab, threshold, lsh=(b, r, num_perm)) | {"bands": b, "rows": r}
        for name, (lab, (b, r)) in labels.items()
    }
