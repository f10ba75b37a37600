"""Sources of random 64-bit words for the noise samplers.

Two sources sit behind one interface, :class:`RandomSource`:

* :class:`SeededSource` (test mode): a counter-based Philox stream whose 128-bit key is the SHA-256 of
  the seed and the stream's key parts; the pipeline keys every stream by ``(product, level, geocode,
  query)`` (:func:`noise_key`). A node's noise therefore depends only on the run seed, the product, the
  level, the node and the query, never on the worker, partition or order in which nodes are processed
  (DESIGN.md item 2), and two streams never share a key (domain separation: a 15-character custom
  block group code equal to a block GEOID, or the same geocode in two products, get different noise).
* :class:`OSSource` (production mode): words from ``os.urandom``, the operating system's CSPRNG. The
  Bureau mixed Intel RDRAND into the same kernel source (``source/programs/engine/rngs.py`` in GitHub
  uscensusbureau/DAS_2020_Redistricting_Production_Code); no seed, not
  reproducible by design.

:meth:`RandomSource.integers` draws exact uniform integers in ``[0, m)`` by rejection (no modulo bias).
"""
from __future__ import annotations

import hashlib
import os
import threading
from abc import ABC, abstractmethod
from json.encoder import encode_basestring_ascii

import numpy as np

_TWO64 = 1 << 64


class RandomSource(ABC):
    """A stream of independent uniform 64-bit words."""

    @abstractmethod
    def uint64(self, n: int) -> np.ndarray:
        """The next ``n`` words of the stream (uint64 array)."""

    def integers(self, m: int, size: int) -> np.ndarray:
        """``size`` exact uniform integers in ``[0, m)``, ``1 <= m <= 2**64`` (uint64 array).

        A word ``w`` is kept when ``w < limit``, the largest multiple of ``m`` not above ``2**64``; the kept
        words are uniform on ``[0, limit)`` and ``w mod m`` is exactly uniform. At least half the words
        are kept, so the expected cost is below two words per integer.
        """
        if not 1 <= m <= _TWO64:
            raise ValueError(f"integers: the range m must be in [1, 2**64], got {m}")
        out = np.empty(size, dtype=np.uint64)
        if m == 1:
            out[:] = 0
            return out
        limit = _TWO64 - _TWO64 % m
        filled = 0
        while filled < size:
            need = size - filled
            words = self.uint64(need + need // 2 + 8 if limit < _TWO64 else need)
            if limit < _TWO64:
                words = words[words < np.uint64(limit)]
            take = words[:need]
            out[filled:filled + take.size] = take % np.uint64(m) if m < _TWO64 else take
            filled += take.size
        return out

    def bits(self, size: int) -> np.ndarray:
        """``size`` independent fair bits (uint8 array of 0/1), 64 per word."""
        words = self.uint64(-(-size // 64))
        return np.unpackbits(words.view(np.uint8))[:size]


def noise_key(product_name: str, level: str, geocode: str, query: str) -> tuple[str, str, str, str]:
    """The key parts of the noise stream of one query at one node (domain separation by product and level)."""
    return str(product_name), str(level), str(geocode), str(query)


def key_material(seed: int, parts: tuple[str, ...]) -> bytes:
    """``json.dumps(["census-topdown/rng/v2", seed, *parts]).encode()``, the bytes a stream's key hashes,
    spelled out with json's own string encoder (a third of the cost of ``json.dumps``; tests/test_mechanisms.py
    checks the two agree)."""
    return ("[" + ", ".join(['"census-topdown/rng/v2"', int.__repr__(seed), *map(encode_basestring_ascii, parts)])
            + "]").encode()


class SeededSource(RandomSource):
    """Philox4x64 stream keyed by SHA-256 of ``(seed, *parts)``; for tests and reproducible runs.

    The parts are JSON-encoded as a list, so no two different tuples of parts share a key.

    Constructing a numpy Philox costs about 20 microseconds, more than the few hundred words most
    streams ever read (one stream per node and query: tens of thousands per task). So every read comes
    from this thread's shared generator set to the stream's key and to the position after the words the
    stream has read: Philox is counter-based (block i of four words is the cipher of counter i + 1; numpy
    increments the counter before it enciphers), so counter ``r // 4`` with an empty buffer, then
    ``r % 4`` words skipped, gives word r onward: the same words as one fresh ``Philox(key=...)`` read
    in turn, without replaying the words already read (the discrete Gaussian's second round re-reads
    every detailed-query stream)."""

    def __init__(self, seed: int, *parts: str) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"SeededSource: seed must be an int, got {seed!r}")
        if not parts:
            raise TypeError("SeededSource: at least one key part (the pipeline uses noise_key(...))")
        parts = tuple(str(p) for p in parts)
        self._set(seed, parts, key_material(seed, parts))

    def _set(self, seed: int, parts: tuple[str, ...], material: bytes) -> None:
        self.seed, self.parts = seed, parts
        self._key = np.frombuffer(hashlib.sha256(material).digest(), dtype="<u8", count=2).astype(np.uint64)
        self._read = 0  # words of the stream read so far

    @classmethod
    def of_nodes(cls, seed: int, product_name: str, level: str, geocodes: list[str], query: str) -> list["SeededSource"]:
        """``SeededSource(seed, *noise_key(product_name, level, g, query))`` for every geocode g, the same streams:
        the key material's common head and tail are spelled once (a third of a source's set-up)."""
        product_name, level, _, query = noise_key(product_name, level, "", query)
        head = key_material(seed, (product_name, level))[:-1] + b", "  # the list without its "]", then the geocode
        tail = b", " + encode_basestring_ascii(query).encode() + b"]"
        out = []
        for g in geocodes:
            g = str(g)
            source = cls.__new__(cls)
            source._set(seed, (product_name, level, g, query), head + encode_basestring_ascii(g).encode() + tail)
            out.append(source)
        if out and out[0]._key.tobytes() != cls(seed, *out[0].parts)._key.tobytes():  # checks the seed too
            raise AssertionError("SeededSource.of_nodes: the key material differs from key_material's")
        return out

    def uint64(self, n: int) -> np.ndarray:
        n = int(n)
        shared = _shared_philox()
        counter = _ZERO4 if self._read < 4 else np.array([self._read >> 2, 0, 0, 0], dtype=np.uint64)
        shared.state = {"bit_generator": "Philox", "state": {"counter": counter, "key": self._key},
                        "buffer": _ZERO4, "buffer_pos": 4, "has_uint32": 0, "uinteger": 0}
        if self._read & 3:
            shared.random_raw(self._read & 3)
        self._read += n
        return np.asarray(shared.random_raw(n), dtype=np.uint64)

    def __repr__(self) -> str:
        return f"SeededSource(seed={self.seed}, parts={self.parts!r})"


_ZERO4 = np.zeros(4, dtype=np.uint64)
_LOCAL = threading.local()


def _shared_philox() -> np.random.Philox:
    """This thread's generator for first reads (Dask runs tasks on several threads of one process)."""
    gen = getattr(_LOCAL, "philox", None)
    if gen is None:
        gen = _LOCAL.philox = np.random.Philox(key=0)
    return gen


class OSSource(RandomSource):
    """Words from ``os.urandom`` (the operating system's CSPRNG): the production source."""

    def uint64(self, n: int) -> np.ndarray:
        return np.frombuffer(os.urandom(8 * int(n)), dtype="<u8").astype(np.uint64)

    def __repr__(self) -> str:
        return "OSSource()"


def noise_sources(mode: str, seed: int | None, product_name: str, level: str, geocodes: list[str], query: str
                  ) -> list[RandomSource]:
    """``make_source(mode, seed, *noise_key(product_name, level, g, query))`` for every geocode g (the noise streams
    of one query at many nodes)."""
    if mode == "test" and seed is not None and geocodes:
        return SeededSource.of_nodes(seed, product_name, level, geocodes, query)
    return [make_source(mode, seed, *noise_key(product_name, level, g, query)) for g in geocodes]


def make_source(mode: str, seed: int | None, *parts: str) -> RandomSource:
    """The source of one stream (key ``parts``, e.g. :func:`noise_key`): ``"test"`` mode needs a seed,
    ``"production"`` refuses one."""
    if mode == "test":
        if seed is None:
            raise ValueError("make_source: mode \"test\" needs an integer seed")
        return SeededSource(seed, *parts)
    if mode == "production":
        if seed is not None:
            raise ValueError(f"make_source: mode \"production\" draws from os.urandom and refuses a seed (got {seed!r})")
        return OSSource()
    raise ValueError(f"make_source: unknown mode {mode!r} (expected \"test\" or \"production\")")
