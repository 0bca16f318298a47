"""What one request cost, from the price table (proxy/config/prices.py) and what the upstream reported."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass

from proxy.config.prices import PriceConfig
from proxy.formats import Usage
from proxy.formats.images import ImageMade

_MILLION = 1_000_000
_REMEMBERED = 4096  # model names looked up (clients name them; past this the table is searched again)


@dataclass(slots=True, frozen=True)
class Charge:
    cost: float
    priced: bool  # a row of the table matched the model (else the cost is 0)


class PriceTable:
    __slots__ = ("_rows", "_found")

    def __init__(self, rows: Sequence[PriceConfig]) -> None:
        self._rows = tuple(rows)
        self._found: dict[str, PriceConfig | None] = {}

    def __bool__(self) -> bool:
        return bool(self._rows)

    def row_for(self, model: str | None) -> PriceConfig | None:
        """The first row whose glob matches `model`."""
        if model is None:
            return None
        if model in self._found:
            return self._found[model]
        row = next((r for r in self._rows if fnmatch.fnmatchcase(model, r.model)), None)
        if len(self._found) < _REMEMBERED:
            self._found[model] = row
        return row

    def default_output(self, model: str | None) -> int | None:
        """The most output `model` makes when a request names no limit, as its row says (None:
        no row, or the row does not say)."""
        row = self.row_for(model)
        return row.max_output_tokens if row is not None else None

    def charge(
        self, model: str | None, usage: Usage, images: Sequence[ImageMade] = (), video_seconds: float = 0.0
    ) -> Charge:
        row = self.row_for(model)
        if row is None:
            return Charge(0.0, False)
        cached = min(usage.cached_input_tokens or 0, usage.input_tokens or 0)
        reasoning = min(usage.reasoning_tokens or 0, usage.output_tokens or 0)
        tokens = ((usage.input_tokens or 0) - cached) * row.input_per_mtok
        tokens += cached * (row.cached_input_per_mtok if row.cached_input_per_mtok is not None else row.input_per_mtok)
        tokens += ((usage.output_tokens or 0) - reasoning) * row.output_per_mtok
        tokens += reasoning * (row.reasoning_per_mtok if row.reasoning_per_mtok is not None else row.output_per_mtok)
        cost = tokens / _MILLION + sum(_image_price(row, image) for image in images)
        return Charge(cost + video_seconds * row.per_video_second, True)

    def most(self, model: str | None, usage: Usage, images: int = 0, video_seconds: float = 0.0) -> float:
        """The most a request may cost, before it is answered: its images at the dearest size and
        quality its row names."""
        row = self.row_for(model)
        if row is None:
            return 0.0
        dearest = max([row.per_image, *row.per_image_by.values()])
        return self.charge(model, usage, (), video_seconds).cost + images * dearest


def _image_price(row: PriceConfig, image: ImageMade) -> float:
    if row.per_image_by:
        size, quality = image.size or "auto", image.quality or "auto"
        for key in (f"{size}/{quality}", f"{size}/*", f"*/{quality}", "*/*"):
            if key in row.per_image_by:
                return row.per_image_by[key]
    return row.per_image
