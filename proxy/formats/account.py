"""The account endpoints (12: 2FA login, 13: payment webhook): no gateway key; headers pass as sent."""

from __future__ import annotations

from proxy.formats.base import Format, KeyLocation


class AccountFormat(Format):
    name = "account"
    key_location = KeyLocation.NONE
