"""`python -m ipsec_lab.backends`: the registry as the table docs/backends.md holds."""

from ipsec_lab.backends import markdown

print(markdown(), end="")
