"""The corpus file format every pretraining corpus uses: documents separated by
``"\n<|endoftext|>\n"`` (TinyStoriesV2 style), so one reader serves a generated corpus and the
real dataset."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

EOT = "<|endoftext|>"
DOC_SEPARATOR = f"\n{EOT}\n"


def iter_tinystories(path: str | Path, limit: int | None = None, chunk_chars: int = 1 << 20) -> Iterator[str]:
    """Stream the stories of a TinyStoriesV2-style file (separated by ``<|endoftext|>``).

    Reads ``chunk_chars`` at a time, so a multi-GB file never sits in memory. Stories are stripped;
    empty ones are skipped. Stops after ``limit`` stories when given.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"corpus file not found: {p}")
    count, buf = 0, ""
    with open(p, encoding="utf-8") as f:
        while chunk := f.read(chunk_chars):
            # The last piece may continue in the next chunk (a story or a cut separator).
            *done, buf = (buf + chunk).split(EOT)
            for part in done:
                if part.strip():
                    yield part.strip()
                    count += 1
                    if limit is not None and count >= limit:
                        return
    if buf.strip():
        yield buf.strip()


def read_documents(path: str | Path, limit: int | None = None) -> Iterator[str]:
    """Documents of a corpus file written by a corpus builder (or a TinyStoriesV2 file)."""
    return iter_tinystories(path, limit)
