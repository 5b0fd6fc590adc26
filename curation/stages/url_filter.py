"""``url_filter``: drops documents whose URL a domain / URL list, a regex or a sub-word blocks
(``curation.text.urls``). Signals ``url_blocked`` (bool) and ``url_block_list`` (the name of the
first list that blocks it, ``regex`` or ``subword``; null if none); reason ``url_filter:<list name>``.
It measures, then decides with its ``rules`` (thresholds left out of the signals hash); the
blocklist files are hashed into the parameters, so editing one re-runs the stage."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from curation.io.shards import replace_column
from curation.stages.base import MapStage, Resources, Rule, registry
from curation.stages.paths import PathStr, existing_file, file_ids
from curation.text.urls import REGEX, SUBWORD, NamedList, UrlBlocker, check_re2

if TYPE_CHECKING:  # pragma: no cover
    from curation.text.state import TextState


class Blocklist(BaseModel):
    """One named list: files (one domain or URL a line, ``#`` comments) and/or inline entries."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")
    paths: list[PathStr] = Field(default_factory=list)
    entries: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _one_path(cls, data: Any) -> Any:
        if isinstance(data, dict) and "path" in data:  # `path: x` for one file
            data = dict(data)
            path = data.pop("path")
            data["paths"] = [path, *data.get("paths", [])]
        return data

    @field_validator("paths")
    @classmethod
    def _exist(cls, v: list[str]) -> list[str]:
        return [existing_file(p) for p in v]

    @model_validator(mode="after")
    def _not_empty(self) -> Blocklist:
        if not self.paths and not self.entries:
            raise ValueError(f"blocklist {self.name!r}: give `path`, `paths` or `entries`")
        return self


@registry.register("url_filter")
class UrlFilter(MapStage):
    """Drop documents whose ``url`` a blocklist blocks (``curation.text.urls`` says how).

    ``blocklists`` are checked in order, then ``url_regexes`` (RE2, searched in the URL as
    given), then ``url_subwords`` (plain strings, searched in the lower-cased URL); the first
    that blocks a URL names it in ``url_block_list`` and in the reason
    ``url_filter:<name>`` (``url_filter:regex``, ``url_filter:subword``). Rows without a URL
    (no column, null or empty) are never blocked.

    ``report_only``: names whose matches are recorded but not dropped (a threshold: changing
    it re-decides stored rows; ``null`` drops nothing). Example::

        block: {type: url_filter, input: extract,
                blocklists: [{name: adult, path: lists/adult/domains},
                             {name: manual, entries: [example.com, spam.example.org/page]}],
                url_regexes: ['^https?://[^/]*\\.xxx(?:[:/]|$)']}
    """

    type: str = "url_filter"
    columns: ClassVar[tuple[str, ...]] = ('url_blocked',)
    blocklists: list[Blocklist] = Field(default_factory=list)
    url_regexes: list[str] = Field(default_factory=list)
    url_subwords: list[str] = Field(default_factory=list)
    url_column: str = "url"
    report_only: list[str] | None = Field(default_factory=list)

    rules: ClassVar[tuple[Rule, ...]] = (Rule("{value}", "url_block_list", "not in", "report_only"),)
    resources: ClassVar[Resources] = Resources(cpus=1)

    _blocker: UrlBlocker | None = PrivateAttr(default=None)

    @field_validator("url_regexes")
    @classmethod
    def _re2(cls, v: list[str]) -> list[str]:
        for r in v:
            check_re2(r)
        return v

    @model_validator(mode="after")
    def _names(self) -> UrlFilter:
        names = [b.name for b in self.blocklists]
        if len(set(names)) != len(names):
            raise ValueError(f"blocklist names must be unique, got {names}")
        if {REGEX, SUBWORD} & set(names):
            raise ValueError(f"{REGEX!r} and {SUBWORD!r} name the regex and sub-word matches, not a list")
        return self

    def params(self) -> dict[str, Any]:
        p = super().params()
        for lst, b in zip(p["blocklists"], self.blocklists):
            lst["paths"] = file_ids(b.paths)
        return p

    def setup(self) -> None:
        if self._blocker is None:
            lists = [NamedList.from_sources(b.name, b.paths, b.entries) for b in self.blocklists]
            self._blocker = UrlBlocker(lists, self.url_regexes, self.url_subwords)

    def measure(self, batch: pa.Table, text: TextState | None = None) -> tuple[pa.Table, TextState | None]:
        self.setup()
        n = batch.num_rows
        if self.url_column in batch.column_names:
            code = self._blocker.match(batch.column(self.url_column))
        else:
            code = np.full(n, -1, np.int64)
        names = pa.array(self._blocker.names, pa.string())
        listed = names.take(pa.array(code, pa.int64(), mask=code < 0))  # null where not blocked
        table = replace_column(batch, "url_blocked", pa.array(code >= 0, pa.bool_()))
        table = replace_column(table, "url_block_list", listed)
        return table, text
