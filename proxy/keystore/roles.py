"""The admin roles, in order of what they may do (proxy/keystore/access.py decides by them)."""

ROLES = ("owner", "operator", "viewer", "tenant-admin")
