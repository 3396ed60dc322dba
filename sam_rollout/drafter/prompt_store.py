"""Prompt store: finished responses of earlier visits to a prompt, offered to its next visit.

RL passes over the same prompts many times (an epoch of DAPO-Math-17k is 35 steps at 512 prompts a
step), and the rollout engine lives across steps. A global history holds only the last few steps, so
the responses to a prompt's previous visit are gone by its next one; this store keeps them per
prompt, as raw tokens, within a byte budget.

- Key: a 16-byte BLAKE2b digest of the prompt's int32 tokens (a collision could only make drafts
  worse, never outputs: every draft is verified).
- Per prompt, the newest responses up to `tokens_per_prompt` tokens (older ones of that prompt go
  first; a longer response keeps its beginning, where the next visit's drafts start).
- Over the byte budget, whole prompts go, least recently updated first.
- A trajectory (a multi-turn rollout, a resumed partial one) is stored once under its first prompt: its
  later text replaces its earlier text there (`add(..., replaces=...)`).
- `nbytes` counts the token arrays, the keys and a fixed allowance per prompt and per response for the
  Python objects around them (measured by tests/test_prompt_store.py with tracemalloc).
- `save`/`load`: a versioned file (docs/prompt-store.md), so the store outlives the engine (a training
  checkpoint and resume). Both stream the tokens: neither holds a second copy of the store.
- `export`/`import_entries`: a few prompts' responses copied to another engine's store (the router's store
  handoff, when it sends a prompt's next visit elsewhere), in a plain wire form (`encode_entries`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import zipfile
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import numpy as np

logger = logging.getLogger(__name__)

ENTRY_OVERHEAD_BYTES = 400  # per prompt: the key object, the entry and its list, the dict slot
RESPONSE_OVERHEAD_BYTES = 120  # per response: the array object and its list slot

FORMAT_VERSION = 1  # of the saved file; a file of another version is not read (docs/prompt-store.md)
KEY_BYTES = 16
TOKEN_DTYPE = np.dtype("<i4")  # tokens on disk, whatever the machine's byte order


class PromptStoreFileError(ValueError):
    """Why a saved store cannot be used (`PromptStore.load` reports it with the file's name)."""


@dataclass
class PromptStoreStats:
    """Counters since the store was made, and what it holds now."""

    hits: int = 0  # visits that found earlier responses
    misses: int = 0  # visits that found none
    offered_tokens: int = 0  # tokens handed to visits
    added_responses: int = 0
    evicted_prompts: int = 0  # dropped for the byte budget
    dropped_responses: int = 0  # dropped for a prompt's token cap or with an evicted prompt
    exported_prompts: int = 0  # prompts copied out for another engine (a store handoff)
    imported_responses: int = 0  # responses copied in from another engine, new to this store
    prompts: int = 0
    responses: int = 0
    tokens: int = 0
    nbytes: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


class _Entry:
    __slots__ = ("responses", "tokens")

    def __init__(self) -> None:
        self.responses: list[np.ndarray] = []
        self.tokens = 0


def prompt_key(prompt: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(prompt, dtype=np.int32).tobytes(), digest_size=KEY_BYTES).digest()


class PromptStore:
    """Finished responses per prompt, within `budget_bytes`; see the module docstring."""

    def __init__(self, budget_bytes: int, tokens_per_prompt: int) -> None:
        if budget_bytes <= 0 or tokens_per_prompt <= 0:
            raise ValueError(
                f"PromptStore needs budget_bytes > 0 and tokens_per_prompt > 0, got {budget_bytes} and "
                f"{tokens_per_prompt}"
            )
        self.budget_bytes = budget_bytes
        self.tokens_per_prompt = tokens_per_prompt
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._stats = PromptStoreStats()

    def responses(self, prompt: np.ndarray, visit: bool = True) -> list[np.ndarray]:
        """The stored responses to this prompt (oldest first) for a new visit; counts a hit or miss,
        unless `visit` is False: a later request of a trajectory (a later turn, a resumed partial
        rollout), whose visit its first request counted."""
        entry = self._entries.get(prompt_key(prompt))
        if entry is not None and visit:
            self._stats.hits += 1
            self._stats.offered_tokens += entry.tokens
        elif visit:
            self._stats.misses += 1
        return [] if entry is None else list(entry.responses)

    def add(self, prompt: np.ndarray, response: np.ndarray, replaces: np.ndarray | None = None) -> None:
        """Keep a finished response (copied) as the newest of its prompt; evict to stay in budget.
        `replaces`: the response's trajectory's earlier text as it was added (a turn before, an aborted
        attempt); the newest stored response equal to it goes, so a trajectory is kept once."""
        if response.size == 0:
            return
        key = prompt_key(prompt)
        if replaces is not None and key in self._entries:
            self._drop_equal(self._entries[key], replaces[: self.tokens_per_prompt])
        self._add(key, [np.array(response[: self.tokens_per_prompt], dtype=np.int32)])

    def export(self, keys: list[bytes]) -> dict[bytes, list[np.ndarray]]:
        """The stored responses (oldest first) of each key this store holds, for another engine's store;
        not a visit (no hit or miss counted)."""
        out = {key: list(self._entries[key].responses) for key in keys if key in self._entries}
        self._stats.exported_prompts += len(out)
        return out

    def import_entries(self, entries: dict[bytes, list[np.ndarray]]) -> int:
        """Keep each key's responses (oldest first, as `export` gives them) as the newest of that prompt,
        under this store's cap and budget; a response equal to one stored for the prompt is kept once.
        Returns the responses new to this store."""
        new = 0
        for key, responses in entries.items():
            if len(key) != KEY_BYTES:
                raise ValueError(f"a prompt key is {KEY_BYTES} bytes, got {len(key)}")
            kept = self._within_cap([np.array(r, dtype=np.int32).reshape(-1) for r in responses if len(r)])
            entry = self._entries.get(key)
            if entry is not None:
                for response in kept:
                    before = len(entry.responses)
                    self._drop_equal(entry, response)
                    new += len(entry.responses) == before
            else:
                new += len(kept)
            self._add(key, kept)
        self._stats.imported_responses += new
        return new

    def items(self) -> Iterator[tuple[bytes, list[np.ndarray]]]:
        """(key, responses oldest first) per prompt, least recently updated prompt first."""
        for key, entry in self._entries.items():
            yield key, list(entry.responses)

    # ------------------------------------------------------------------ file ------------------
    def save(self, path: str) -> int:
        """Write the store to `path` (docs/prompt-store.md), atomically: a temporary file in the same
        folder, renamed over `path` when complete. Creates the folder. Returns the file's bytes;
        raises OSError when it cannot be written (and leaves no temporary file)."""
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + ".", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                self._write(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise
        return os.path.getsize(path)

    @classmethod
    def load(cls, path: str, budget_bytes: int, tokens_per_prompt: int) -> tuple[PromptStore, str | None]:
        """The store saved at `path` with this budget and per-prompt cap, and None; or, when the file
        cannot be used (missing, another format version, corrupt or truncated), an empty store and
        the reason, also logged as a warning: the run goes on without the saved responses.

        Contents and their order are kept; past a smaller budget or cap, what `add` would drop goes
        (least recently updated prompts first). hits, misses, offered and added tokens start at zero;
        evicted_prompts and dropped_responses count what the file held but the store does not."""
        store = cls(budget_bytes, tokens_per_prompt)
        try:
            with zipfile.ZipFile(path) as archive:
                store._read(archive)
        except FileNotFoundError:
            return cls._unused(path, "no such file", budget_bytes, tokens_per_prompt)
        except Exception as e:  # whatever a damaged file makes zipfile or numpy raise: never stop the run
            reason = str(e) if isinstance(e, PromptStoreFileError) else f"{type(e).__name__}: {e}"
            return cls._unused(path, reason, budget_bytes, tokens_per_prompt)
        return store, None

    @classmethod
    def _unused(cls, path: str, reason: str, budget_bytes: int, tokens_per_prompt: int) -> tuple[PromptStore, str]:
        problem = f"SAM prompt store file {path} not used ({reason}); the prompt store starts empty"
        logger.warning(problem)
        return cls(budget_bytes, tokens_per_prompt), problem

    def _write(self, f) -> None:
        keys, counts, lengths = [], [], []
        for key, entry in self._entries.items():
            keys.append(np.frombuffer(key, dtype=np.uint8))
            counts.append(len(entry.responses))
            lengths.extend(r.size for r in entry.responses)
        arrays = {
            "format_version": np.int64(FORMAT_VERSION),
            "budget_bytes": np.int64(self.budget_bytes),
            "tokens_per_prompt": np.int64(self.tokens_per_prompt),
            "keys": np.array(keys, dtype=np.uint8).reshape(-1, KEY_BYTES),
            "response_offsets": _offsets(counts),
            "token_offsets": _offsets(lengths),
        }
        with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for name, array in arrays.items():
                with archive.open(name + ".npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, array, allow_pickle=False)
            with archive.open("tokens.npy", "w", force_zip64=True) as member:
                header = {"descr": np.lib.format.dtype_to_descr(TOKEN_DTYPE), "fortran_order": False}
                np.lib.format.write_array_header_1_0(member, header | {"shape": (int(sum(lengths)),)})
                for entry in self._entries.values():
                    for response in entry.responses:
                        member.write(response.astype(TOKEN_DTYPE, copy=False))

    def _read(self, archive: zipfile.ZipFile) -> None:
        """Fill this (empty) store from a saved file, replaying its responses in their order;
        raises PromptStoreFileError (or the zip or numpy error) on anything unexpected."""
        names = set(archive.namelist())
        if "format_version.npy" not in names:
            raise PromptStoreFileError("not a SAM prompt store file: no format_version")
        version = int(_read_array(archive, "format_version", np.int64, ()))
        if version != FORMAT_VERSION:
            raise PromptStoreFileError(f"format version {version}; this code reads version {FORMAT_VERSION}")
        for name in ("budget_bytes", "tokens_per_prompt"):  # the saving store's; this one keeps its own
            if int(_read_array(archive, name, np.int64, ())) < 1:
                raise PromptStoreFileError(f"{name} is not positive")
        keys = _read_array(archive, "keys", np.uint8, (None, KEY_BYTES))
        response_offsets = _read_array(archive, "response_offsets", np.int64, (keys.shape[0] + 1,))
        token_offsets = _read_array(archive, "token_offsets", np.int64, (int(response_offsets[-1]) + 1,))
        # every stored prompt has a response, and every stored response a token
        _check_offsets("response_offsets", response_offsets)
        _check_offsets("token_offsets", token_offsets)
        lengths = np.diff(token_offsets)
        with archive.open("tokens.npy") as member:
            _read_token_header(member, int(token_offsets[-1]))
            for i, key in enumerate(keys):
                responses = [
                    _read_tokens(member, int(n)) for n in lengths[response_offsets[i] : response_offsets[i + 1]]
                ]
                # a prompt at a time: the budget then evicts whole prompts, as brute force over the file would
                self._add(key.tobytes(), self._within_cap(responses))
            if member.read(1):  # also makes zipfile check the member's CRC, if it has not yet
                raise PromptStoreFileError("tokens.npy holds more tokens than token_offsets says")
        self._stats = PromptStoreStats(  # what the file held but the budget and cap leave out
            evicted_prompts=keys.shape[0] - self._stats.prompts,
            dropped_responses=lengths.size - self._stats.responses,
            prompts=self._stats.prompts,
            responses=self._stats.responses,
            tokens=self._stats.tokens,
            nbytes=self._stats.nbytes,
        )

    def _within_cap(self, responses: list[np.ndarray]) -> list[np.ndarray]:
        """What `add` keeps of a prompt's responses (oldest first) under this store's cap: each cut to
        its beginning, then the newest that fit. Fitting them first keeps a load from evicting for
        responses the cap drops anyway."""
        cap = self.tokens_per_prompt
        kept, tokens = [], 0
        for response in reversed(responses):
            response = response[:cap].copy() if response.size > cap else response
            if tokens + response.size > cap:
                break
            kept.append(response)
            tokens += response.size
        return kept[::-1]

    def _add(self, key: bytes, responses: list[np.ndarray]) -> None:
        """Keep `responses` (int32 arrays the store now owns, 1 to tokens_per_prompt tokens each, oldest
        first) as the newest of the prompt with this key; evict to stay in budget."""
        if not responses:
            return
        entry = self._entries.pop(key, None)
        if entry is None:
            entry = _Entry()
            self._stats.prompts += 1
            self._stats.nbytes += len(key) + ENTRY_OVERHEAD_BYTES
        self._entries[key] = entry  # the most recently updated prompt goes last
        for response in responses:
            entry.responses.append(response)
            entry.tokens += response.size
            self._account(1, response.size)
            self._stats.added_responses += 1
        while entry.tokens > self.tokens_per_prompt:
            old = entry.responses.pop(0)
            entry.tokens -= old.size
            self._account(-1, -old.size)
            self._stats.dropped_responses += 1
        while self._stats.nbytes > self.budget_bytes and self._entries:
            self._evict_oldest()

    def _drop_equal(self, entry: _Entry, response: np.ndarray) -> None:
        """Drop the entry's newest response equal to `response`, if any."""
        for i in range(len(entry.responses) - 1, -1, -1):
            old = entry.responses[i]
            if np.array_equal(old, response):
                del entry.responses[i]
                entry.tokens -= old.size
                self._account(-1, -old.size)
                return

    def stats(self) -> PromptStoreStats:
        return PromptStoreStats(**asdict(self._stats))

    @property
    def nbytes(self) -> int:
        return self._stats.nbytes

    def __len__(self) -> int:
        return len(self._entries)

    def _account(self, responses: int, tokens: int) -> None:
        self._stats.responses += responses
        self._stats.tokens += tokens
        self._stats.nbytes += responses * RESPONSE_OVERHEAD_BYTES + tokens * 4

    def _evict_oldest(self) -> None:
        key, entry = self._entries.popitem(last=False)
        self._account(-len(entry.responses), -entry.tokens)
        self._stats.nbytes -= len(key) + ENTRY_OVERHEAD_BYTES
        self._stats.prompts -= 1
        self._stats.evicted_prompts += 1
        self._stats.dropped_responses += len(entry.responses)


def encode_entries(entries: dict[bytes, list[np.ndarray]]) -> dict[str, list[bytes]]:
    """`export`'s result as plain types for an RPC: keys in hex, each response its little-endian int32 bytes."""
    return {key.hex(): [np.asarray(r).astype(TOKEN_DTYPE).tobytes() for r in rs] for key, rs in entries.items()}


def decode_entries(wire: dict[str, list[bytes]]) -> dict[bytes, list[np.ndarray]]:
    """`encode_entries`' inverse; raises ValueError on a malformed key or response."""
    out = {}
    for key_hex, responses in wire.items():
        key = bytes.fromhex(key_hex)
        if len(key) != KEY_BYTES or any(len(r) % TOKEN_DTYPE.itemsize for r in responses):
            raise ValueError(f"malformed prompt-store entry {key_hex!r}")
        out[key] = [np.frombuffer(r, dtype=TOKEN_DTYPE).astype(np.int32) for r in responses]
    return out


def _offsets(counts: list[int]) -> np.ndarray:
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def _read_array(archive: zipfile.ZipFile, name: str, dtype, shape: tuple) -> np.ndarray:
    """Member `name`.npy, checked for dtype and shape (None: any length on that axis)."""
    try:
        with archive.open(name + ".npy") as member:
            array = np.lib.format.read_array(member, allow_pickle=False)
    except KeyError:
        raise PromptStoreFileError(f"{name}.npy is missing") from None
    if array.dtype != dtype or array.ndim != len(shape):
        raise PromptStoreFileError(f"{name} is {array.dtype} {array.shape}, expected {np.dtype(dtype)} {shape}")
    if any(want is not None and got != want for got, want in zip(array.shape, shape)):
        raise PromptStoreFileError(f"{name} has shape {array.shape}, expected {shape}")
    return array


def _check_offsets(name: str, offsets: np.ndarray) -> None:
    if offsets[0] != 0 or (offsets.size > 1 and np.diff(offsets).min() < 1):
        raise PromptStoreFileError(f"{name} does not start at 0 and grow by at least 1 at each step")


def _read_token_header(member, count: int) -> None:
    version = np.lib.format.read_magic(member)
    if version != (1, 0):
        raise PromptStoreFileError(f"tokens.npy has a version {version} array header, expected (1, 0)")
    shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(member)
    if dtype != TOKEN_DTYPE or fortran_order or shape != (count,):
        raise PromptStoreFileError(f"tokens.npy is {dtype} {shape}, expected {TOKEN_DTYPE} ({count},)")


def _read_tokens(member, count: int) -> np.ndarray:
    """The next `count` tokens of an open tokens.npy, as a new int32 array; token ids are >= 0."""
    response = np.empty(count, dtype=TOKEN_DTYPE)
    view = memoryview(response).cast("B")
    done = 0
    while done < view.nbytes:
        got = member.readinto(view[done:])
        if not got:
            raise PromptStoreFileError("tokens.npy ends early (truncated file)")
        done += got
    if count and response.min() < 0:
        raise PromptStoreFileError("tokens.npy holds a negative token id")
    return response.astype(np.int32, copy=False)
