"""Replace e-mail addresses and public IP addresses in text (FineWeb's PII step, extended).

What is replaced:

- **e-mail addresses**: ``local@domain.tld`` where the local part is RFC 5322's dot-atom
  (letters, digits and ``!#$%&'*+/=?^_`{|}~-``, dots between them) and the domain is dotted
  DNS labels ending in a top-level domain the public suffix list knows (the snapshot bundled
  with the ``tld`` package): ``logo@2x.png`` or ``user@host.local`` are left alone, FineWeb's
  regex replaces them.
- **IP addresses**: IPv4 dotted quads (no leading zeros, not part of a longer dotted number
  such as a version ``1.2.3.4.5``) and IPv6 (full, compressed ``::`` and IPv4-mapped forms),
  each validated by ``ipaddress``. As in FineWeb only *global* (publicly routable) addresses
  are replaced by default: private (``192.168.0.2``), loopback (``127.0.0.1``), link-local,
  documentation and other reserved addresses are kept (``only_public_ips=False`` replaces
  every valid address).

Replacements (the defaults keep the text's shape: a model still sees an address there, but
one that can belong to nobody): e-mails become ``email@example.com`` or
``firstname.lastname@example.org`` (FineWeb's; ``example.*`` is reserved by RFC 2606), IPv4
addresses an address from the documentation ranges of RFC 5737 (``192.0.2.0/24``,
``198.51.100.0/24``, ``203.0.113.0/24``), IPv6 addresses one from ``2001:db8::/32``
(RFC 3849). When a list holds several, the one used is picked by a CRC-32 of the original
address, so the same address gets the same replacement everywhere and the output does not
depend on batch boundaries or worker count (FineWeb cycles through its list). A replacement
found in the text is not counted or replaced again, so scrubbing twice changes nothing more.

Speed: the (RE2, Arrow) pre-checks pick the documents that can hold an address at all (an
``@`` between word characters, a dotted quad, an IPv6-looking run); only those go through
Python's regexes.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import zlib
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

DEFAULT_EMAIL_REPLACEMENTS = ("email@example.com", "firstname.lastname@example.org")
DEFAULT_IPV4_REPLACEMENTS = ("192.0.2.146", "198.51.100.23", "203.0.113.87")
DEFAULT_IPV6_REPLACEMENTS = ("2001:db8::5f3a:1c2", "2001:db8:4b::e7")

_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
EMAIL_RE = re.compile(
    rf"(?<![A-Za-z0-9!#$%&'*+/=?^_`{{|}}~.@-]){_ATOM}(?:\.{_ATOM})*"
    r"@((?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+([A-Za-z][A-Za-z0-9-]{0,61}[A-Za-z0-9]))"
    r"(?![A-Za-z0-9-]|\.[A-Za-z0-9])"
)
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
IPV4_RE = re.compile(rf"(?<![\w.]){_OCTET}(?:\.{_OCTET}){{3}}(?![\w]|\.[0-9])")
_H = r"[0-9A-Fa-f]{1,4}"
IPV6_RE = re.compile(
    r"(?<![\w:.])(?:"
    rf"(?:(?:{_H})?:){{2,6}}{_OCTET}(?:\.{_OCTET}){{3}}"  # ::ffff:1.2.3.4
    rf"|(?:(?:{_H})?:){{2,7}}(?:{_H})?"
    r")(?![\w:]|\.[0-9])"
)
# Cheap RE2 pre-checks over the whole column: a document failing one cannot hold the kind.
_EMAIL_HINT = r"[A-Za-z0-9_\-]@[A-Za-z0-9]"
_IPV4_HINT = r"[0-9]\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]"
_IPV6_HINT = r"[0-9A-Fa-f]?::|(?:[0-9A-Fa-f]{1,4}:){3}"


@lru_cache(maxsize=1)
def known_tlds() -> frozenset[str]:
    """Top-level labels of the public suffix list bundled with ``tld`` (ASCII, punycode too)."""
    from tld.utils import get_tld_names  # noqa: PLC0415

    names = get_tld_names()
    out: set[str] = set()
    for trie in names.values():
        for label in (trie.root.children or {}):
            label = label.lower()
            out.add(label)
            if not label.isascii():
                with contextlib.suppress(UnicodeError):  # no punycode form: the label itself is in
                    out.add(label.encode("idna").decode("ascii"))
    return frozenset(out)


def _pick(choices: tuple[str, ...], original: str) -> str:
    return choices[zlib.crc32(original.encode()) % len(choices)] if len(choices) > 1 else choices[0]


@dataclass
class PiiScrubber:
    """Replaces e-mails and IPs in texts; see the module docstring."""

    emails: bool = True
    ips: bool = True
    only_public_ips: bool = True
    email_replacements: tuple[str, ...] = DEFAULT_EMAIL_REPLACEMENTS
    ipv4_replacements: tuple[str, ...] = DEFAULT_IPV4_REPLACEMENTS
    ipv6_replacements: tuple[str, ...] = DEFAULT_IPV6_REPLACEMENTS
    _tlds: frozenset[str] = field(default_factory=frozenset, repr=False)

    def __post_init__(self) -> None:
        for name in ("email_replacements", "ipv4_replacements", "ipv6_replacements"):
            value = tuple(getattr(self, name))
            if not value:
                raise ValueError(f"{name}: at least one replacement")
            setattr(self, name, value)
        self._keep = set(self.email_replacements) | set(self.ipv4_replacements) | set(self.ipv6_replacements)
        if self.emails:
            self._tlds = known_tlds()

    # -- one text -------------------------------------------------------------------------

    def scrub_emails(self, text: str) -> tuple[str, int]:
        n = 0

        def sub(m: re.Match) -> str:
            nonlocal n
            s = m.group(0)
            if s in self._keep or m.group(2).lower() not in self._tlds:
                return s
            n += 1
            return _pick(self.email_replacements, s)

        return EMAIL_RE.sub(sub, text), n

    def _ip_sub(self, pattern: re.Pattern, choices: tuple[str, ...], text: str) -> tuple[str, int]:
        n = 0

        def sub(m: re.Match) -> str:
            nonlocal n
            s = m.group(0)
            if s in self._keep:
                return s
            try:
                ip = ipaddress.ip_address(s)
            except ValueError:
                return s
            if self.only_public_ips and not ip.is_global:
                return s
            n += 1
            return _pick(choices, s)

        return pattern.sub(sub, text), n

    def scrub(self, text: str) -> tuple[str, int, int]:
        """``(text, e-mails replaced, IPs replaced)``."""
        n_email = n_ip = 0
        if self.emails:
            text, n_email = self.scrub_emails(text)
        if self.ips:
            # IPv6 first: an IPv4-mapped address (``::ffff:1.2.3.4``) is one IPv6 address
            text, n6 = self._ip_sub(IPV6_RE, self.ipv6_replacements, text)
            text, n4 = self._ip_sub(IPV4_RE, self.ipv4_replacements, text)
            n_ip = n4 + n6
        return text, n_email, n_ip

    # -- a column -------------------------------------------------------------------------

    def candidates(self, texts: pa.Array) -> np.ndarray:
        """Rows that may hold something to replace (RE2 pre-checks), as a bool mask."""
        hint = []
        if self.emails:
            hint.append(_EMAIL_HINT)
        if self.ips:
            hint += [_IPV4_HINT, _IPV6_HINT]
        if not hint:
            return np.zeros(len(texts), bool)
        hit = pc.match_substring_regex(texts, "|".join(f"(?:{h})" for h in hint))
        return pc.fill_null(hit, False).to_numpy(zero_copy_only=False)

    def scrub_column(self, texts: pa.Array | pa.ChunkedArray) -> tuple[pa.Array, np.ndarray, np.ndarray]:
        """``(new texts, e-mails replaced per row, IPs replaced per row)``; nulls stay null."""
        if isinstance(texts, pa.ChunkedArray):
            texts = texts.combine_chunks()
        n = len(texts)
        n_email = np.zeros(n, np.int32)
        n_ip = np.zeros(n, np.int32)
        idx = np.flatnonzero(self.candidates(texts))
        if not len(idx):
            return texts, n_email, n_ip
        changed = []
        new_values = []
        for i, t in zip(idx.tolist(), texts.take(pa.array(idx)).to_pylist()):
            new, e, p = self.scrub(t)
            if e or p:
                n_email[i], n_ip[i] = e, p
                changed.append(i)
                new_values.append(new)
        if not changed:
            return texts, n_email, n_ip
        # put the new values in place: take from [texts, new values] by position
        order = np.arange(n, dtype=np.int64)
        order[np.array(changed, np.int64)] = n + np.arange(len(changed), dtype=np.int64)
        merged = pa.concat_arrays([texts, pa.array(new_values, texts.type)])
        return merged.take(pa.array(order)), n_email, n_ip
