"""The model families, defined once: one frozen `Family` record each (DESIGN.md "Batches").

Standard library only, so both sides of the batch contract read the same records:
`data/converters.py` registers one feature converter per family, `models/` builds one model
per family and lays out its batches. What differs between families is data (`Family`'s
fields), not if-chains.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class Family:
    """The batch layout of one model family.

    `encoder_features`: task features the encoder reads (`encoder_input_tokens`), empty for
    decoder-only families; `decoder_features`: task features concatenated into the decoder's
    sequence, in order; `prefix_attention`: the batches carry `decoder_causal_attention` (1 on
    the inputs and the first target position, SeqIO's convention) and the decoder attends
    bidirectionally within it.
    """

    name: str
    encoder_features: tuple[str, ...]
    decoder_features: tuple[str, ...]
    prefix_attention: bool = False

    @property
    def has_encoder(self) -> bool:
        """True when task inputs are encoded, not part of the decoder's sequence."""
        return bool(self.encoder_features)

    def stack_lengths(self, sequence_length: Mapping[str, int]) -> dict[str, int]:
        """Task feature lengths -> token length per stack: `{'encoder': Li, 'decoder': Lt}`
        with an encoder, else `{'decoder': Li + Lt}` (a missing 'inputs', a targets-only task,
        counts 0 in the decoder; an encoder needs it)."""
        lengths = {"encoder": sum(int(sequence_length[f]) for f in self.encoder_features)
                   } if self.has_encoder else {}
        lengths["decoder"] = sum(int(sequence_length.get(f, 0)) for f in self.decoder_features)
        return lengths


ENCODER_DECODER = Family("encoder_decoder", ("inputs",), ("targets",))
DECODER_ONLY = Family("decoder_only", (), ("inputs", "targets"))
PREFIX_LM = Family("prefix_lm", (), ("inputs", "targets"), prefix_attention=True)

#: Name -> record, in DESIGN.md's order.
FAMILIES: dict[str, Family] = {f.name: f for f in (ENCODER_DECODER, DECODER_ONLY, PREFIX_LM)}
#: The family names (`TransformerConfig.family`, `get_dataset(model_family=...)`).
NAMES: tuple[str, ...] = tuple(FAMILIES)

