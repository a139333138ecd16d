"""Domain exceptions the detector raises (STYLE 12).

The service maps each class to a status and a problem type in one table (``service/errors.py``);
the CLI prints the message. Messages may name fingerprints, key ids and limits, never key
material. Exceptions keep their constructor arguments in ``args`` so they pickle across worker
processes, and build the message in ``__str__``.
"""

from __future__ import annotations


class DetectorError(Exception):
    """Base of the detector's domain errors (bad *input values* stay ``ValueError``)."""


class TokenizerMismatch(DetectorError):
    """The key was made for another tokenizer than the one detection would use.

    Detection with a different tokenizer maps the text to other ids, so every pivot is
    unrelated to the key and the result is meaningless (a false "not detected"): refuse.

    Attributes:
        key_fingerprint: the tokenizer fingerprint stored in the key record.
        tokenizer_fingerprint: the fingerprint of the detector's tokenizer.
        key_id: the key's public id, when known.
    """

    def __init__(
        self, key_fingerprint: str, tokenizer_fingerprint: str, key_id: str | None = None
    ) -> None:
        super().__init__(key_fingerprint, tokenizer_fingerprint, key_id)
        self.key_fingerprint = key_fingerprint
        self.tokenizer_fingerprint = tokenizer_fingerprint
        self.key_id = key_id

    def __str__(self) -> str:
        which = f"key {self.key_id}" if self.key_id else "the key"
        return (
            f"{which} was made for tokenizer {self.key_fingerprint}, but the detector's "
            f"tokenizer is {self.tokenizer_fingerprint}: detect with the key's model"
        )
