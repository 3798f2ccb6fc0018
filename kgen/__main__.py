"""`python -m kgen ...` is the `kgen` command."""
from .cli import main

main()
