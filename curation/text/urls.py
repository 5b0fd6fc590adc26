"""URL blocklists: domain lists with subdomain matching, exact-URL lists, URL regexes.

A ``UrlBlocker`` holds named lists, checked in order, then the regexes, then the sub-words:

- a **domain** entry blocks that host and every host under it, on label boundaries:
  ``example.com`` blocks ``example.com``, ``www.example.com`` and ``a.b.example.com``, never
  ``notexample.com``. The walk from the host towards the root stops at the host's registered
  domain, found with the public suffix list (the ICANN section of the snapshot bundled with
  the ``tld`` package; nothing is downloaded): an entry that is itself a public suffix
  (``com``, ``co.uk``) blocks only that exact host, never a whole suffix; block a whole TLD
  with a regex. Private-section suffixes (``blogspot.com``, ``github.io``) are ordinary
  domains here, as in tldextract's default, so listing ``blogspot.com`` blocks every blog on
  it. A host the list does not know (``localhost``, ``foo.internal``) takes its last label as
  suffix (the list's ``*`` rule); an IP address matches only itself.
- a **URL** entry (a line with a ``/``) blocks exactly that URL, compared as
  host + path + query: scheme, user info, port, fragment and a trailing ``/`` are ignored and
  the host is lower-cased (``https://WWW.Example.com/a/`` and ``www.example.com/a`` are the
  same entry).
- **regexes** (RE2 syntax, searched anywhere in the URL as given) and **sub-words** (plain
  strings, searched anywhere in the lower-cased URL) are one compiled alternation each,
  run by Arrow over the whole column.

List files: one domain or URL per line; ``#`` starts a comment (at the start of a line or
after a space); empty lines are skipped; a leading ``*.`` or ``.`` is dropped; hosts-file
lines (``0.0.0.0 example.com``) give their host; ``.gz`` files are read compressed.
Hosts are compared in lower case, internationalised names as punycode (``xn--``), so a list
may use either form.

Speed: the hosts of a batch are extracted by one Arrow regex and de-duplicated; each distinct
host's parents are looked up in one set (results memoised across batches), and the public
suffix list is consulted only for a host with a listed parent; only rows whose host appears
in some URL entry are normalised in Python. Regexes and sub-words are one Arrow (RE2) pass
each over the column.
"""

from __future__ import annotations

import contextlib
import gzip
import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: scheme, user info, then the host (a bracketed IPv6 literal or up to ``:/?#``)
_HOST_RE = r"^(?:[A-Za-z][A-Za-z0-9+.\-]*:)?(?://)?(?:[^@/?#]*@)?(?P<host>\[[^\]/]*\]|[^:/?#]*)"
#: ``reason`` values for matches that do not come from a named list
REGEX, SUBWORD = "regex", "subword"
_MEMO_LIMIT = 1 << 20


def canonical_host(host: str) -> str:
    """Lower case, no trailing dot or brackets, internationalised labels as punycode."""
    h = host.strip().lower().rstrip(".")
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    if not h.isascii():
        with contextlib.suppress(UnicodeError):  # not valid IDNA: matched as written
            h = h.encode("idna").decode("ascii")
    return h


def _is_ip(host: str) -> bool:
    if not host or not (host[-1].isdigit() or ":" in host):  # cheap: most hosts end in a letter
        return False
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _psl_suffix(host: str) -> str | None:
    """The host's public suffix (ICANN section of the bundled list), or None if unknown."""
    from tld import get_tld  # noqa: PLC0415 (loads the bundled list on first use)

    res = get_tld("http://" + host, as_object=True, search_private=False, fail_silently=True)
    return None if res is None else res.tld


def host_candidates(host: str) -> list[str]:
    """The names a domain entry may be listed under to block ``host``: the host itself, then
    each parent down to its registered domain (public suffix list), most specific first."""
    if not host or _is_ip(host):
        return [host] if host else []
    labels = host.split(".")
    suffix = _psl_suffix(host)
    if suffix is not None:
        suffix = canonical_host(suffix)
    n_suffix = len(suffix.split(".")) if suffix and host.endswith(suffix) else 1
    if n_suffix >= len(labels):  # the host is a public suffix itself
        return [host]
    return [".".join(labels[i:]) for i in range(len(labels) - n_suffix)]


def url_key(url: str) -> str | None:
    """A URL as compared with URL entries: canonical host + path + query, no trailing ``/``."""
    m = re.match(r"^(?:[A-Za-z][A-Za-z0-9+.\-]*:)?(?://)?(?:[^@/?#]*@)?(\[[^\]/]*\]|[^:/?#]*)(?::\d*)?([^#]*)", url)
    if m is None:
        return None
    host = canonical_host(m.group(1))
    if not host:
        return None
    rest = m.group(2)
    if rest.startswith("?"):
        rest = "/" + rest
    path, q, query = rest.partition("?")
    path = path.rstrip("/")
    return host + path + (q + query if query else "")


def parse_entry(line: str) -> tuple[str, str] | None:
    """One list line as ``("domain", host)`` or ``("url", key)``, or None (comment, blank)."""
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    text = re.split(r"\s#", text, maxsplit=1)[0].strip()
    parts = text.split()
    if len(parts) >= 2 and _is_ip(parts[0]):  # hosts-file line: "0.0.0.0 example.com"
        text = parts[1]
    elif len(parts) != 1:
        return None
    if "/" in text:
        key = url_key(text)
        return ("url", key) if key else None
    if text.startswith("*."):
        text = text[2:]
    host = canonical_host(text.lstrip("."))
    return ("domain", host) if host else None


def read_list_lines(path: str | Path) -> Iterable[str]:
    """The lines of a list file (``.gz`` read compressed), as text."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        yield from f


@dataclass
class NamedList:
    """One named blocklist: domains (blocking their subdomains too) and exact URLs."""

    name: str
    domains: set[str] = field(default_factory=set)
    urls: set[str] = field(default_factory=set)

    def add(self, lines: Iterable[str]) -> NamedList:
        for line in lines:
            entry = parse_entry(line)
            if entry is not None:
                (self.domains if entry[0] == "domain" else self.urls).add(entry[1])
        return self

    @classmethod
    def from_sources(cls, name: str, paths: Iterable[str] = (), entries: Iterable[str] = ()) -> NamedList:
        out = cls(name)
        for p in paths:
            out.add(read_list_lines(p))
        return out.add(entries)


def check_re2(pattern: str) -> None:
    """Raise ValueError unless Arrow's RE2 compiles ``pattern``."""
    try:
        pc.match_substring_regex(pa.array([""]), pattern)
    except pa.ArrowInvalid as e:
        raise ValueError(f"not a valid RE2 regex: {pattern!r} ({e})") from None


class UrlBlocker:
    """Named lists (checked in order), then regexes, then sub-words; see the module docstring.

    ``match(urls)`` returns, per row, the index of the first source that blocks the URL:
    ``0..len(lists)-1`` for a named list, ``len(lists)`` for a regex, ``len(lists)+1`` for a
    sub-word, ``-1`` when nothing does (also for null or empty URLs). ``names`` maps an index
    to its name (``regex``, ``subword`` for the last two)."""

    def __init__(self, lists: list[NamedList], regexes: Iterable[str] = (), subwords: Iterable[str] = ()):
        self.lists = list(lists)
        self.names = [lst.name for lst in self.lists] + [REGEX, SUBWORD]
        regexes = [r for r in regexes if r]
        for r in regexes:
            check_re2(r)
        self.regex = "|".join(f"(?:{r})" for r in regexes) or None
        words = [w.lower() for w in subwords if w]
        self.subword = "|".join(re.escape(w) for w in words) or None
        if self.subword:
            check_re2(self.subword)
        # domain -> index of the first list holding it
        self._domain_list: dict[str, int] = {}
        for i, lst in reversed(list(enumerate(self.lists))):
            self._domain_list.update(dict.fromkeys(lst.domains, i))
        self._url_list: dict[str, int] = {}
        for i, lst in reversed(list(enumerate(self.lists))):
            self._url_list.update(dict.fromkeys(lst.urls, i))
        self._url_hosts = {k.split("/", 1)[0].split("?", 1)[0] for k in self._url_list}
        self._memo: dict[str, tuple[int, bool]] = {}

    def _host_lookup(self, raw_host: str) -> tuple[int, bool]:
        """(first domain list blocking this host or -1, whether some URL entry has its host)."""
        got = self._memo.get(raw_host)
        if got is None:
            host = canonical_host(raw_host)
            idx = -1
            if self._domain_list:
                # every parent first (set lookups); the public suffix list only when one is listed
                labels = host.split(".")
                listed = [c for c in (".".join(labels[k:]) for k in range(len(labels))) if c in self._domain_list]
                if listed:
                    allowed = set(host_candidates(host))
                    found = [self._domain_list[c] for c in listed if c in allowed]
                    idx = min(found) if found else -1
            got = (idx, host in self._url_hosts)
            if len(self._memo) >= _MEMO_LIMIT:
                self._memo.clear()
            self._memo[raw_host] = got
        return got

    def match(self, urls: pa.Array | pa.ChunkedArray) -> np.ndarray:
        if isinstance(urls, pa.ChunkedArray):
            urls = urls.combine_chunks()
        if not pa.types.is_string(urls.type):
            urls = urls.cast(pa.string())
        n = len(urls)
        code = np.full(n, -1, np.int64)
        if n == 0:
            return code
        big = len(self.lists) + 2
        if self._domain_list or self._url_list:
            hosts = pc.struct_field(pc.extract_regex(urls, _HOST_RE), "host")
            uniq = pc.unique(hosts)
            found = [self._host_lookup(h) if h else (-1, False) for h in uniq.to_pylist()]
            pos = pc.fill_null(pc.index_in(hosts, value_set=uniq), -1).to_numpy(zero_copy_only=False)
            valid = pos >= 0
            pos = np.where(valid, pos, 0)
            dom = np.array([f[0] for f in found] or [-1], np.int64)[pos]
            code = np.where(valid & (dom >= 0), dom, big)
            if self._url_list:
                has_url_host = np.array([f[1] for f in found] or [False], bool)[pos] & valid
                for i in np.flatnonzero(has_url_host):
                    key = url_key(urls[int(i)].as_py())
                    j = self._url_list.get(key, -1) if key else -1
                    if j >= 0 and j < code[i]:
                        code[i] = j
        else:
            code[:] = big
        if self.regex is not None:
            hit = pc.fill_null(pc.match_substring_regex(urls, self.regex), False).to_numpy(zero_copy_only=False)
            code = np.where(hit & (code == big), len(self.lists), code)
        if self.subword is not None:
            hit = pc.fill_null(pc.match_substring_regex(pc.utf8_lower(urls), self.subword), False)
            hit = hit.to_numpy(zero_copy_only=False)
            code = np.where(hit & (code == big), len(self.lists) + 1, code)
        code[code == big] = -1
        return code
