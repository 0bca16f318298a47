"""The price table: what a model's tokens, images and video seconds cost, per model glob.

    prices:
      - model: "respmodel-4o*"           # a glob on the model the client asked for; the first match wins
        input_per_mtok: 2.50              # per million prompt tokens
        cached_input_per_mtok: 1.25       # of them, read from a cache (unset: the input price)
        output_per_mtok: 10.00            # per million generated tokens
        reasoning_per_mtok: 10.00         # of them, thinking (unset: the output price)
        max_output_tokens: 16384          # what it makes when a request names no limit (reserved then)
      - model: "imagegen-*"
        per_image: 0.04                   # an image whose size and quality no row below names
        per_image_by: {"1024x1024/high": 0.17, "*/low": 0.01}
      - model: "videogen-*"
        per_video_second: 0.10

Amounts are in whatever currency the operator prices in; the gateway never converts. A model no
row matches costs nothing and is counted as unpriced.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

Amount = Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)]

# SIZE/QUALITY: a size as the spec writes it (1024x1024, auto, 2K) or *, then a quality (every one
# the images schema takes: proxy/schemas/images.py QUALITIES) or *.
_IMAGE_PRICE_KEY = re.compile(r"^(\*|auto|\d{1,5}x\d{1,5}|\d{1,2}K)/(\*|auto|low|medium|high|xhigh|max|standard|hd)$")


class PriceConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=200)
    input_per_mtok: Amount = 0.0
    cached_input_per_mtok: Amount | None = None
    output_per_mtok: Amount = 0.0
    reasoning_per_mtok: Amount | None = None
    per_image: Amount = 0.0
    per_image_by: dict[str, Amount] = Field(default_factory=dict)
    per_video_second: Amount = 0.0
    # The most output the model makes when a request names no limit: what budgets and token
    # limits reserve for such a request (unset: their configured default_reserve_tokens).
    max_output_tokens: int | None = Field(default=None, ge=1, le=2**31)

    @field_validator("per_image_by")
    @classmethod
    def _image_keys(cls, value: dict[str, float]) -> dict[str, float]:
        for key in value:
            if not _IMAGE_PRICE_KEY.match(key):
                raise ValueError(
                    f"{key!r} is not SIZE/QUALITY: a size (1024x1024, 1536x1024, auto, 2K or *), "
                    "a slash, and a quality (low, medium, high, xhigh, max, standard, hd, auto or *)"
                )
        return value


def shadowed(rows: list[PriceConfig]) -> list[str]:
    """Rows no model can reach, an earlier row's glob matching every name theirs does (the first
    match wins): a price that would never be charged."""
    problems = []
    for index, row in enumerate(rows):
        earlier = next((i for i in range(index) if fnmatch.fnmatchcase(row.model, rows[i].model)), None)
        if earlier is not None:
            problems.append(
                f"prices[{index}].model: {row.model!r} is never reached: prices[{earlier}] "
                f"({rows[earlier].model!r}) matches every model it does, and the first match wins"
            )
    return problems
