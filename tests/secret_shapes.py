"""The corpus of secret shapes in tests/data/secret_shapes.txt, for the tests of every sink."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CORPUS = Path(__file__).parent / "data" / "secret_shapes.txt"


@dataclass(frozen=True)
class SecretShape:
    name: str
    text: str
    secret: str

    @property
    def url(self) -> str | None:
        """The URL of a url-* shape (the word starting with a scheme)."""
        if not self.name.startswith("url-"):
            return None
        return next(word for word in self.text.split() if "://" in word)


def secret_shapes() -> list[SecretShape]:
    shapes = []
    for line in CORPUS.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, text, secret = line.split("\t")
        shapes.append(SecretShape(name, text.replace("\\n", "\n"), secret))
    return shapes


SHAPES = secret_shapes()
IDS = [shape.name for shape in SHAPES]
URL_SHAPES = [shape for shape in SHAPES if shape.url]
