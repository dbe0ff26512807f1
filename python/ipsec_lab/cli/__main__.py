"""`python -m ipsec_lab.cli`: the `ipsec-lab` command."""

import sys

from ipsec_lab.cli import main

sys.exit(main())
