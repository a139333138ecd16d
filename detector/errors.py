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
    Generation refuses too (its text would carry a mark no detection of the key could read).
    The message names both models where they are known, with the fingerprints' first
    ``FINGERPRINT_SHOWN`` characters.

    Attributes:
        key_fingerprint: the tokenizer fingerprint stored in the key record.
        tokenizer_fingerprint: the fingerprint of the tokenizer in use.
        key_id: the key's public id, when known.
        key_model: the name of the model the key was made for, when the record holds one.
        model: the name of the model in use, when known.
    """

    def __init__(
        self,
        key_fingerprint: str,
        tokenizer_fingerprint: str,
        key_id: str | None = None,
        key_model: str | None = None,
        model: str | None = None,
    ) -> None:
        super().__init__(key_fingerprint, tokenizer_fingerprint, key_id, key_model, model)
        self.key_fingerprint = key_fingerprint
        self.tokenizer_fingerprint = tokenizer_fingerprint
        self.key_id = key_id
        self.key_model = key_model
        self.model = model

    def __str__(self) -> str:
        which = f"key {self.key_id}" if self.key_id else "the key"
        if self.model is None and self.key_model is None:
            return (
                f"{which} was made for tokenizer {self.key_fingerprint}, but the detector's "
                f"tokenizer is {self.tokenizer_fingerprint}: detect with the key's model"
            )
        made_for = _model_of(self.key_model, "an unnamed model", self.key_fingerprint)
        used = _model_of(self.model, "the model in use", self.tokenizer_fingerprint)
        advice = f"use it with {self.key_model!r}" if self.key_model else "use it with its model"
        other = f"a key made for {self.model!r}" if self.model else "a key made for this model"
        return (
            f"{which} was made for {made_for} and cannot be used with {used}: {advice}, or {other}"
        )


FINGERPRINT_SHOWN = 15
"""Characters of a fingerprint a message shows: ``sha256:`` and 8 hex digits, enough to tell
two tokenizers apart (the key listing shows the whole fingerprint)."""


def _model_of(model: str | None, unnamed: str, fingerprint: str) -> str:
    """``model 'A' (tokenizer sha256:ab12cd34…)``, or ``unnamed`` for the model."""
    shown = fingerprint[:FINGERPRINT_SHOWN] + ("…" if len(fingerprint) > FINGERPRINT_SHOWN else "")
    return f"{f'model {model!r}' if model else unnamed} (tokenizer {shown})"


class TextTokenIdsMismatch(DetectorError):
    """``text`` and ``token_ids`` were both given, and the ids do not decode to the text.

    Detection scores the ids; a caller who also sends a text reads the verdict as one about
    that text. When the ids decode to another text, any verdict would be about something the
    caller did not mean (an unrelated text would read as "watermarked"), so detection refuses
    rather than answers. Ids that decode to the text but that re-tokenizing would not produce
    (case C9) agree: ``retokenization_matches`` reports that case.

    Attributes:
        offset: the first character at which the decoding and the text differ (the shorter
            one's length when one is a prefix of the other).
        text_length: the text's length in characters.
        decoded_length: the decoding's length in characters.
    """

    def __init__(self, offset: int, text_length: int, decoded_length: int) -> None:
        super().__init__(offset, text_length, decoded_length)
        self.offset = offset
        self.text_length = text_length
        self.decoded_length = decoded_length

    def __str__(self) -> str:
        return (
            f"text and token_ids disagree: the ids decode to {self.decoded_length} characters "
            f"that differ from the {self.text_length} of text at character {self.offset}; "
            "send the text the ids decode to, or only one of the two"
        )
