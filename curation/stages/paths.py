"""Stage parameters that name files: declared, so whoever validates a DAG for someone else
can check them before anything opens them.

```python
model: Annotated[str, PathParam()]                                  # always a path
lang_config: Annotated[str, PathParam(when=lang_rules.is_file)] | None  # a preset name, or a path
```

A ``PathParam`` field's value goes through the *path guard* in force before any other
validator of the field sees it. Without a guard (``refinery run``: the user's own process) the
value passes unchanged. The service sets one for each submitted DAG
(``curation.service.auth.PathPolicy.guard``): the value is resolved against its base
directory, symlinks followed, and refused (``PathRefused``, not a validation error: it is not
the value's shape that is wrong) unless it lies under an allowed root; the field then holds
the resolved path. So a validator that opens a model or a tokenizer only ever opens a file
the policy allowed, and a refused name never tells whether it exists.

Every other string parameter is data (a ``where`` expression, a URL regex, a blocklist
entry) however many ``/`` it holds. A stage of one's own declares its path fields the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic_core import core_schema


class PathRefused(PermissionError):
    """A path parameter outside what the guard in force allows."""


#: (value, field name) -> the value to validate (the resolved path), or PathRefused
Guard = Callable[[str, str], str]
_GUARD: ContextVar[Guard | None] = ContextVar("refinery_path_guard", default=None)


@contextmanager
def path_guard(guard: Guard | None) -> Iterator[None]:
    """Within this block (this thread / task), every ``PathParam`` value goes through ``guard``."""
    token = _GUARD.set(guard)
    try:
        yield
    finally:
        _GUARD.reset(token)


@dataclass(frozen=True)
class PathParam:
    """Marks a ``str`` field (or the items of a ``list[str]`` / values of a ``dict[str, str]``)
    as naming a file or directory. ``when``: for fields that take either a name (a shipped
    preset) or a path, which values are paths."""

    when: Callable[[str], bool] | None = None

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.with_info_before_validator_function(self._guard, handler(source))

    def _guard(self, value: Any, info: core_schema.ValidationInfo) -> Any:
        guard = _GUARD.get()
        if guard is None or not isinstance(value, str) or (self.when is not None and not self.when(value)):
            return value
        return guard(value, info.field_name or "path")


#: a parameter that is always a file or directory
PathStr = Annotated[str, PathParam()]


def existing_file(p: str) -> str:
    """A file parameter's value: the resolved path of a file that exists (ValueError if not)."""
    path = Path(p).expanduser()
    if not path.is_file():
        raise ValueError(f"file {p} does not exist")
    return str(path.resolve())


def file_ids(paths: list[str]) -> list[dict[str, str]]:
    """Files as they enter a params hash: base name and content hash (moving a file keeps
    the hash, editing it changes it)."""
    from curation.io.files import cached_file_sha256

    return [{"name": Path(p).name, "sha256": cached_file_sha256(p)} for p in paths]
