"""Bearer tokens by kind: ``producer``, ``worker`` or ``admin``.

The token file holds one ``KIND TOKEN_SHA256`` per line (``#`` comments and
blank lines allowed); the server keeps only the hashes. A presented token is
hashed and compared against every stored hash with
:func:`hmac.compare_digest`, without stopping at the first match, so timing
says nothing about which hash (or how much of one) matched.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable
from pathlib import Path

from pgqueue.errors import InvalidOption
from pgqueue.grants import KINDS, Kind

_HEX64 = re.compile(r"[0-9a-f]{64}")
# A rank per kind: each kind may do what the ones below it may.
RANK: dict[Kind, int] = {"producer": 0, "worker": 1, "admin": 2}


def hash_token(token: str) -> str:
    """The SHA-256 hex digest to put in a token file for ``token``."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class Tokens:
    """The accepted tokens, as (kind, sha256) pairs."""

    def __init__(self, entries: Iterable[tuple[str, str]]) -> None:
        pairs: list[tuple[Kind, bytes]] = []
        for kind, digest in entries:
            known = _kind(kind)
            digest = digest.strip().lower()
            if not _HEX64.fullmatch(digest):
                raise InvalidOption(
                    f"token hash for {known!r} must be 64 hex digits (sha256), got {digest[:16]!r}"
                )
            pairs.append((known, bytes.fromhex(digest)))
        self._pairs = tuple(pairs)

    @classmethod
    def parse(cls, text: str, source: str = "tokens") -> Tokens:
        """Tokens from the text of a token file (``KIND TOKEN_SHA256`` lines)."""
        entries: list[tuple[str, str]] = []
        for number, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 2:
                raise InvalidOption(
                    f"{source}:{number}: expected 'KIND TOKEN_SHA256' "
                    f"(KIND one of {', '.join(KINDS)})"
                )
            try:
                entries.append((parts[0], parts[1]))
                cls([(parts[0], parts[1])])
            except InvalidOption as exc:
                raise InvalidOption(f"{source}:{number}: {exc}") from None
        return cls(entries)

    @classmethod
    def from_file(cls, path: str | Path) -> Tokens:
        """Tokens from a token file."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise InvalidOption(f"cannot read token file {str(path)!r}: {exc.strerror}") from None
        return cls.parse(text, str(path))

    @property
    def kinds(self) -> frozenset[Kind]:
        """The kinds that have at least one token."""
        return frozenset(kind for kind, _ in self._pairs)

    def __len__(self) -> int:
        return len(self._pairs)

    def kind_of(self, token: str) -> Kind | None:
        """The kind of ``token``, or None when no stored hash matches."""
        found = self.identify(token)
        return None if found is None else found[0]

    def identify(self, token: str) -> tuple[Kind, int] | None:
        """The kind of ``token`` and the number of its line (its identity
        for per-token limits), or None when no stored hash matches."""
        digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        found: tuple[Kind, int] | None = None
        for number, (kind, stored) in enumerate(self._pairs):  # no early exit: constant time
            if hmac.compare_digest(digest, stored) and found is None:
                found = (kind, number)
        return found


def _kind(kind: str) -> Kind:
    for known in KINDS:
        if kind == known:
            return known
    raise InvalidOption(f"unknown token kind {kind!r}: one of {', '.join(KINDS)}")
