"""``pii``: replaces e-mail addresses and public IP addresses in ``text`` (``curation.text.pii``,
FineWeb's formatter); never drops. Signals ``pii_emails``, ``pii_ips`` (replaced). It rewrites the
text, so it returns a new ``TextState`` carrying the word counts of rows it left unchanged."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import pyarrow as pa
from pydantic import Field, PrivateAttr

from curation.io.shards import replace_column
from curation.stages.base import MapStage, StageResult, registry
from curation.text.pii import (DEFAULT_EMAIL_REPLACEMENTS, DEFAULT_IPV4_REPLACEMENTS, DEFAULT_IPV6_REPLACEMENTS,
                               PiiScrubber)
from curation.text.state import rewritten_state

if TYPE_CHECKING:  # pragma: no cover
    from curation.text.state import TextState


@registry.register("pii")
class PiiScrub(MapStage):
    """Replace e-mail addresses and public IP addresses in ``text`` (``curation.text.pii``:
    what counts, which replacements and why). Never drops a document.

    Signals: ``pii_emails``, ``pii_ips`` (how many were replaced in the row)."""

    type: str = "pii"
    columns: ClassVar[tuple[str, ...]] = ('pii_emails', 'pii_ips')
    rewrites_text: ClassVar[bool] = True
    emails: bool = True
    ips: bool = True
    #: replace only globally routable addresses (FineWeb); False: every valid address
    only_public_ips: bool = True
    email_replacements: list[str] = Field(default_factory=lambda: list(DEFAULT_EMAIL_REPLACEMENTS), min_length=1)
    ipv4_replacements: list[str] = Field(default_factory=lambda: list(DEFAULT_IPV4_REPLACEMENTS), min_length=1)
    ipv6_replacements: list[str] = Field(default_factory=lambda: list(DEFAULT_IPV6_REPLACEMENTS), min_length=1)

    _scrubber: PiiScrubber | None = PrivateAttr(default=None)

    def setup(self) -> None:
        if self._scrubber is None:
            self._scrubber = PiiScrubber(self.emails, self.ips, self.only_public_ips, tuple(self.email_replacements),
                                         tuple(self.ipv4_replacements), tuple(self.ipv6_replacements))

    def process(self, batch: pa.Table, text: TextState | None = None) -> StageResult:
        self.setup()
        if text is not None:
            text = self.text_state(batch, text)
        old = batch.column("text").combine_chunks()
        new, n_email, n_ip = self._scrubber.scrub_column(old)
        table = replace_column(batch, "text", new)
        table = replace_column(table, "pii_emails", pa.array(n_email, pa.int32()))
        table = replace_column(table, "pii_ips", pa.array(n_ip, pa.int32()))
        field = batch.schema.field("text")
        state = text if new is old and text is not None else rewritten_state(old, new, text, field)
        return StageResult.keep_all(table, state)
