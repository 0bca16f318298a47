"""What a request costs by the price table, and the token counts it is priced on, read alike from
every format's own usage fields."""

from __future__ import annotations

import pytest

from proxy.config import ConfigError
from proxy.formats import Usage
from proxy.formats.content import ContentFormat
from proxy.formats.images import ImageMade
from proxy.formats.message import MessageFormat
from proxy.formats.response import ResponseFormat
from proxy.policy.prices import PriceTable
from proxy.registry import parse_config

TABLE = parse_config(
    """
prices:
  - {model: "respmodel-4o-mini*", input_per_mtok: 0.15, output_per_mtok: 0.6}
  - {model: "respmodel-*", input_per_mtok: 2, cached_input_per_mtok: 0.5, output_per_mtok: 8, reasoning_per_mtok: 20}
  - {model: "imagegen-*", per_image: 0.04, per_image_by: {"1024x1024/high": 0.17, "1024x1024/*": 0.07, "*/low": 0.01}}
  - {model: "videogen-*", per_video_second: 0.5}
""",
    {},
).prices


def test_tokens_are_priced_per_million_the_cached_and_reasoning_parts_at_their_own_prices() -> None:
    table = PriceTable(TABLE)
    usage = Usage(input_tokens=1_000_000, output_tokens=500_000, cached_input_tokens=400_000, reasoning_tokens=100_000)
    charge = table.charge("respmodel-5", usage)
    expected = (
        600_000 * 2e-6 + 400_000 * 0.5e-6 + 400_000 * 8e-6 + 100_000 * 20e-6
    )  # uncached, cached, output, reasoning
    assert charge.priced and charge.cost == pytest.approx(expected)
    mini = table.charge("respmodel-4o-mini", usage)  # the first matching row wins; unset prices fall back
    assert mini.cost == pytest.approx(1_000_000 * 0.15e-6 + 500_000 * 0.6e-6)


def test_a_model_no_row_matches_is_free_and_unpriced() -> None:
    assert PriceTable(TABLE).charge("genmodel-2.0-flash", Usage(100, 100)) == PriceTable([]).charge(None, Usage(1, 1))
    assert not PriceTable(TABLE).charge("genmodel-2.0-flash", Usage(100, 100)).priced


def test_images_are_priced_by_size_and_quality_most_specific_first_and_video_by_the_second() -> None:
    table = PriceTable(TABLE)
    made = [
        ImageMade("1024x1024", "high"),
        ImageMade("1024x1024", "medium"),
        ImageMade("1536x1024", "low"),
        ImageMade("1536x1024", "medium"),
        ImageMade(None, None),
    ]
    assert table.charge("imagegen-1", Usage(), made).cost == pytest.approx(0.17 + 0.07 + 0.01 + 0.04 + 0.04)
    assert table.charge("videogen-3.0", Usage(), video_seconds=8).cost == 4.0


def test_check_config_refuses_negative_prices_and_image_keys_that_are_no_size_and_quality() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config("prices: [{model: x, output_per_mtok: -1, per_image_by: {huge: 1}}, {input_per_mtok: 1}]", {})
    assert [p.split(":")[0] for p in refused.value.problems] == [
        "prices[0].output_per_mtok",
        "prices[0].per_image_by",
        "prices[1].model",
    ]


@pytest.mark.parametrize(
    ("fmt", "body", "expected"),
    [
        (
            MessageFormat(),
            {
                "usage": {
                    "input_tokens": 10,
                    "cache_read_input_tokens": 70,
                    "cache_creation_input_tokens": 20,
                    "output_tokens": 5,
                }
            },
            Usage(100, 5, 70, None),
        ),
        (
            ResponseFormat(),
            {
                "usage": {
                    "input_tokens": 100,
                    "input_tokens_details": {"cached_tokens": 60},
                    "output_tokens": 50,
                    "output_tokens_details": {"reasoning_tokens": 30},
                }
            },
            Usage(100, 50, 60, 30),
        ),
        (
            ContentFormat(),
            {
                "usageMetadata": {
                    "promptTokenCount": 100,
                    "cachedContentTokenCount": 40,
                    "candidatesTokenCount": 20,
                    "thoughtsTokenCount": 15,
                }
            },
            Usage(100, 35, 40, 15),
        ),
        (
            ResponseFormat(),
            {"usage": {"input_tokens": 3, "input_tokens_details": {"cached_tokens": "many"}, "output_tokens": -1}},
            Usage(3, None, None, None),
        ),
    ],
)
def test_every_format_s_usage_counts_the_whole_prompt_and_all_output_with_their_parts(fmt, body, expected) -> None:
    assert fmt.usage_from_body(body) == expected


def test_check_config_names_a_price_row_an_earlier_one_hides() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(
            'prices: [{model: "msgmodel-*", input_per_mtok: 1}, {model: "msgmodel-haiku*", input_per_mtok: 2},'
            ' {model: "respmodel-4o"}, {model: "respmodel-4o"}]',
            {},
        )
    assert refused.value.problems == [
        "prices[1].model: 'msgmodel-haiku*' is never reached: prices[0] ('msgmodel-*') matches every model it does, "
        "and the first match wins",
        "prices[3].model: 'respmodel-4o' is never reached: prices[2] ('respmodel-4o') matches every model it does, "
        "and the first match wins",
    ]
    parse_config('prices: [{model: "msgmodel-haiku*"}, {model: "msgmodel-*"}]', {})  # the narrower first is fine
